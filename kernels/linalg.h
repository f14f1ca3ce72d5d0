// kernels: matrix products. CPU GEMMs go through Eigen (OpenMP-parallel, compiled with
// -march=native -mtune=generic); strided inputs that are row- or column-major are used in
// place, others are made contiguous first.
#pragma once
#include "core/tensor.h"

namespace weft::kernels {

// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, 1-D promoted to a matrix and squeezed
// back, N-D batched with broadcast batch dims. f32, f64 (bf16/f16 computed in f32).
Tensor matmul(const Tensor& a, const Tensor& b);
// out[m,n] = alpha * op(a)[m,k] op(b)[k,n] + beta * out, 2-D only; out must be contiguous.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
          double alpha = 1.0, double beta = 0.0);

}  // namespace weft::kernels
