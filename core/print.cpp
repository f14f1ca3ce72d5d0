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

void print_rec(std::ostringstream& os, const std::vector<double>& v, const Shape& shape,
               const Shape& strides, int64_t dim, int64_t base, bool summarise, bool floating,
               int indent) {
  if (dim == int64_t(shape.size())) {
    double x = v[size_t(base)];
    if (!floating) os << fmt::format("{}", int64_t(x));
    else if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e8) os << fmt::format("{:.1f}", x);
    else os << fmt::format("{:.4g}", x);
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
    print_rec(os, v, shape, strides, dim + 1, base + i * strides[dim], summarise, floating, indent + 1);
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
  if (storage()->is_allocated()) {
    std::vector<double> v = to_vector(*this);
    print_rec(os, v, shape(), contiguous_strides(shape()), 0, 0, numel() > kSummariseAbove,
              is_floating(dtype()), 7);
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
