// kernels: matrix products. CPU GEMMs go through Eigen (OpenMP-parallel, compiled with -march=native -mtune=generic),
// CUDA GEMMs through cuBLASLt (cuda/gemm.h); on both, strided inputs that are row- or column-major are used in place,
// others are made contiguous first.
#pragma once
#include "../core/tensor.h"

namespace weft::kernels {

// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, 1-D promoted to a matrix and squeezed
// back, N-D batched with broadcast batch dims. f32, f64 (bf16/f16 computed in f32).
Tensor matmul(const Tensor& a, const Tensor& b);
// out[m,n] = alpha * op(a)[m,k] op(b)[k,n] + beta * out (+ bias[n] on every row), 2-D only; out must be contiguous and
// of the operands' dtype, or f32 for bf16/f16 operands (f32 sums stored unrounded); a bias is a 1-D [n] of out's dtype,
// with beta 0. The CPU's vdpbf16ps kernel adds the bias as it stores each tile (one rounding, as filling out with it
// and adding the product would give); elsewhere (AMX, the f32 kernels, CUDA) out is filled with it first. a_sums, a
// contiguous 1-D [m] of a's dtype, receives the sums of op(a)'s rows over k (a linear layer's bias gradient beside its
// weight gradient dY^T X): the vdpbf16ps kernel takes them as it packs a transposed a (in f32 over each 64 values, each
// 64 values' total added in f64, rounded to f32 and then to bf16); elsewhere they are reduce(sum) of a over its dim 0
// (trans_a) or 1.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& out,
          double alpha = 1.0, double beta = 0.0, const Tensor& bias = {}, const Tensor& a_sums = {});

// Whether f32 products on CUDA (matmul, gemm, and the GEMMs inside conv2d) may run on TF32 tensor cores: inputs rounded
// to a 10-bit mantissa, f32 accumulation, about 1e-3 relative error, several times faster. Off by default, as
// torch.backends.cuda.matmul.allow_tf32 is; the environment variable WEFT_ALLOW_TF32=1 turns it on at start-up.
// Process-wide, read at each product; no effect on the CPU or on other dtypes.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace weft::kernels
