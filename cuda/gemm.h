// cuda/: matrix products through cuBLASLt, behind kernels/linalg.h (matmul, gemm) and
// the GEMMs inside conv2d. Host code only (g++); see docs/CUDA.md, "GEMM".
//
// weft's matrices are row-major views; cuBLASLt is column-major. A row-major C[m, n] read as
// column-major is C^T[n, m], so every product is issued as C^T = op(B)^T op(A)^T: the operands
// swap places and a row-major operand needs no transpose flag while a column-major one (a
// transposed view) gets CUBLAS_OP_T. Strided views whose rows or columns are unit-stride are
// thus used in place; anything else is made contiguous first.
//
// Precision: f32 in f32 (TF32 tensor cores only after kernels::set_allow_tf32(true)), f64 in
// f64, bf16/f16 operands and outputs with f32 accumulation and f32 alpha/beta.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/cpu/gemm.h"

namespace weft::kernels::cuda {

// One operand of gemm_raw: device pointer, memory layout of one matrix, and the distance in
// elements between consecutive matrices of a batch (0: the same matrix for every batch entry).
struct GemmOperand {
  const void* data = nullptr;
  cpu::MatLayout layout;
  int64_t batch_stride = 0;
};

// For b in [0, batch): c_b[m, n] (row-major, leading dim ldc, c_b = c + b * c_batch_stride)
// = alpha * a_b[m, k] b_b[k, n] + beta * c_b, all of `dtype`, on the current stream of
// `device`. k must be >= 1 (callers handle k == 0); beta == 0 never reads c.
void gemm_raw(DType dtype, int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, void* c,
              int64_t ldc, int64_t c_batch_stride, int64_t batch, double alpha, double beta, int device);

// Drops the cached cuBLASLt algorithm choices (tests; the cache is keyed by every
// parameter of a product, so it never needs invalidating for correctness).
void clear_gemm_cache();

}  // namespace weft::kernels::cuda
