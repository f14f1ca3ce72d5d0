// core: shapes and strides as small integer vectors, and the arithmetic on them that views,
// broadcasting and reductions share.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace weft {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
Shape contiguous_strides(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"
// Wraps a possibly negative dim into [0, ndim); throws naming `op` if out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Numpy/PyTorch broadcasting of two shapes; throws naming `op` and both shapes if impossible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace weft
