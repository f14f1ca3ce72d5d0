// autograd: what the linear nodes (ops_linalg.cpp, ops_low_rank.cpp) share: their output's shape,
// and alpha op(a) op(b) into a new 2-D tensor of `dtype` (a_sums: kernels::gemm's row sums of op(a)).
#pragma once
#include "../kernels/linalg.h"
namespace weft::autograd {
inline Shape with_last(Shape s, int64_t n) { s.back() = n; return s; }
// x as the matrix [rows, x.size(-1)] of its leading dims: reshape({-1, n}), also when n is 0 (empty products).
inline Tensor as_rows(const Tensor& x) { return x.dim() == 1 ? x.unsqueeze(0) : x.flatten(0, -2); }
inline Tensor product(const Tensor& a, bool ta, const Tensor& b, bool tb, DType dtype, double alpha = 1.0,
                      const Tensor& a_sums = {}) {
  Tensor out = empty({a.size(ta ? 1 : 0), b.size(tb ? 0 : 1)}, {.dtype = dtype, .device = a.device()});
  kernels::gemm(a, ta, b, tb, out, alpha, 0.0, {}, a_sums);
  return out;
}
}  // namespace weft::autograd
