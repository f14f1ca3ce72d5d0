// kernels: reductions over any set of dims (empty dims = all dims), with keepdim. 16-bit floats accumulate in f32, f32
// in f32 with pairwise/blocked sums (OpenMP across output elements or across the reduced range, whichever is larger).
#pragma once
#include <utility>

#include "../core/tensor.h"
#include "op_kinds.h"  // ReduceOp

namespace weft::kernels {

// Sum/mean of bool or integer inputs give i64 (sum) or f32 (mean); float inputs keep their dtype. sum_squares takes
// floats and gives f64: on the CPU the same bits as sum of x.to(f64)^2. prod of integers gives i64; max/min keep the
// dtype and propagate NaN. Reducing over no elements gives 0 (sum), 1 (prod), NaN (mean) and is an error for max/min. A
// 0-dim tensor reduces to itself.
Tensor reduce(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim);
// Values and i64 indices of the max/min along one dim (first occurrence on ties; a NaN wins,
// as torch.max). An empty dim is an error.
std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim);
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim);
// Variance with Bessel-style `correction` (1 = unbiased, like torch.var's default); float
// tensors only. Divides by max(0, n - correction), so one element unbiased gives NaN.
Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim);
// Sums x down to `shape` (the inverse of broadcasting `shape` to x's shape); used for
// gradients of broadcast operands. Returns x itself when the shapes are equal.
Tensor sum_to(const Tensor& x, const Shape& shape);

// The dims after wrapping negatives and sorting (all dims when `dims` is empty); throws on
// repeats or out-of-range dims naming `op`.
Shape normalize_dims(const Shape& dims, int64_t ndim, const char* op);
// Shape of a reduction's result.
Shape reduced_shape(const Shape& shape, const Shape& dims_normalized, bool keepdim);

}  // namespace weft::kernels
