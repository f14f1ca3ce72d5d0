#include "core/shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace weft {

// Throws weft::Error naming the shape when the element count overflows int64.
int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t s : shape) {
    if (s == 0) return 0;  // an empty dim makes any product of the others 0
    overflow |= __builtin_mul_overflow(n, s, &n);
  }
  WEFT_CHECK(!overflow, "shape {}: the element count overflows int64", shape_str(shape));
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    // Only an empty tensor's strides can pass int64 (the caller checked numel); they address nothing: wrap.
    __builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s);
  }
  return strides;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  WEFT_CHECK(dim >= lo && dim <= hi, "{}: dim {} out of range for a tensor of {} dims (expected {}..{})",
             op, dim, ndim, lo, hi);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    WEFT_CHECK(da == db || da == 1 || db == 1,
               "{}: shapes {} and {} cannot be broadcast (dim {}: {} vs {})", op, shape_str(a),
               shape_str(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace weft
