// core: printing tensors, PyTorch-style: nested brackets, large tensors summarised.
#include <cmath>
#include <ostream>
#include <sstream>

#include "core/copy.h"
#include "core/error.h"

namespace weft {
namespace {

constexpr int64_t kSummariseAbove = 1000;  // elements
constexpr int64_t kEdgeItems = 3;

// One number format for the whole tensor, as PyTorch chooses it: integers as "2.0",
// moderate magnitudes with 4 decimals, very large or small ones in scientific notation.
enum class Style { integer, whole_float, fixed, scientific };

Style choose_style(const std::vector<double>& v, bool floating) {
  if (!floating) return Style::integer;
  bool whole = true;
  double max_abs = 0, min_abs = INFINITY;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    whole &= x == std::floor(x);
    double a = std::fabs(x);
    max_abs = std::max(max_abs, a);
    if (a > 0) min_abs = std::min(min_abs, a);
  }
  if (whole && max_abs < 1e8) return Style::whole_float;
  if (max_abs >= 1e8 || (min_abs < 1e-4 && max_abs / min_abs > 1e3)) return Style::scientific;
  return Style::fixed;
}

void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape,
               const Shape& strides, int64_t dim, int64_t base, bool summarise, Style style,
               int indent) {
  if (dim == int64_t(shape.size())) {
    double x = v[size_t(base)];
    switch (style) {
      case Style::integer: os << fmt::format("{}", int64_t(x)); break;
      case Style::whole_float: os << fmt::format("{:.1f}", x); break;
      case Style::fixed: os << fmt::format("{:.4f}", x); break;
      case Style::scientific: os << fmt::format("{:.4e}", x); break;
    }
    return;
  }
  os << "[";
  int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << "...";
      i = n - kEdgeItems - 1;
      os << (dim + 1 == int64_t(shape.size()) ? ", " : ",\n" + std::string(size_t(indent + 1), ' '));
      continue;
    }
    print_rec(os, v, shape, strides, dim + 1, base + i * strides[dim], summarise, style, indent + 1);
    if (i + 1 < n) {
      if (dim + 1 == int64_t(shape.size())) os << ", ";
      else os << "," << std::string(size_t(shape.size() - dim - 1), '\n') << std::string(size_t(indent + 1), ' ');
    }
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  if (device().is_meta()) {
    os << "...";  // no values: shape, dtype and device follow
  } else if (storage()->is_allocated()) {
    std::vector<double> v = to_vector(*this);
    print_rec(os, v, shape(), contiguous_strides(shape()), 0, 0, numel() > kSummariseAbove,
              choose_style(v, is_floating(dtype())), 7);
  } else {
    os << "<freed storage>";
  }
  os << ", " << tensor_desc(*this);
  if (requires_grad()) os << ", requires_grad";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace weft
