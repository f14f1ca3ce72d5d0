// kernels/cpu: the GEMM core shared by matmul and convolution. Operands are described by
// their memory layout so that transposed and sliced views reach Eigen without a copy.
#pragma once
#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace weft::kernels::cpu {

// A 2-D operand stored row-major (element (i, j) at i*ld + j) or column-major (at j*ld + i).
struct MatLayout {
  bool ok = false;  // false: the strides fit neither, make the operand contiguous first
  bool row_major = true;
  int64_t ld = 0;
  int64_t rs() const { return row_major ? ld : 1; }  // the strides of a row and of a column
  int64_t cs() const { return row_major ? 1 : ld; }
};
MatLayout mat_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride);
inline MatLayout mat_layout(const Tensor& m) {
  return mat_layout(m.size(-2), m.size(-1), m.stride(-2), m.stride(-1));
}
inline MatLayout row_major(int64_t ld) { return {true, true, ld}; }
inline MatLayout col_major(int64_t ld) { return {true, false, ld}; }
// Rows of a [..., m, k] seen as one row-major [M, k] matrix, when the strides allow it
// (contiguous batches, or rows sliced out of a wider matrix like a fused qkv projection);
// nullopt for broadcast or overlapping rows. Device-independent: the CUDA GEMM uses it too.
std::optional<MatLayout> fold_rows(const Tensor& a);

// c[m, n] (row-major, leading dim ldc) = alpha * a[m, k] b[k, n] + beta * c; T is float or double. beta == 0 never
// reads c. Large products are split over the OpenMP threads unless called from a parallel region.
template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, MatLayout la, const T* b, MatLayout lb, T* c,
          int64_t ldc, T alpha = T(1), T beta = T(0));

// bf16 a and b, products and sums in f32 (the AVX512_BF16 kernel, bgemm.h), c f32 or bf16
// (rounded once, at the end). Only where bf16_gemm_native(): the CPU has AVX512_BF16 and the
// f32 kernel in use is avx512 (WEFT_CPU_GEMM=avx2|eigen turns it off); elsewhere the tensor
// kernels below convert bf16 to f32 and take the f32 GEMM (the same products, no faster).
bool bf16_gemm_native();
// a_sums (m values, or null): a_sums[i] += the sum of a's row i (bgemm.h), only where
// gemm_bf16_sums_a(la): the avx512bf16 kernel and a column-major a, which it packs whole.
template <typename TO>
void gemm_bf16(int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b, MatLayout lb,
               TO* c, int64_t ldc, float alpha = 1.0f, float beta = 0.0f, const TO* bias = nullptr,
               double* a_sums = nullptr);
bool gemm_bf16_sums_a(MatLayout la);

// The f32 GEMM kernel: weft's own packed kernels for AVX-512 (two register tiles: 12 x 32, and 8 x 48, the default on
// Intel) or AVX2 + FMA (sgemm.h), chosen at run time from what the CPU has, else Eigen (f64 always uses Eigen).
// WEFT_CPU_GEMM=avx512|avx512_8x48|avx2|eigen picks one by hand; a bad value is an error at the first f32 GEMM (or
// check_kernel_choices).
enum class SgemmKernel { eigen, avx2, avx512, avx512_8x48 };
inline bool is_avx512(SgemmKernel k) { return k == SgemmKernel::avx512 || k == SgemmKernel::avx512_8x48; }
const char* sgemm_kernel_name(SgemmKernel k);
bool sgemm_kernel_supported(SgemmKernel k);  // this CPU can run it
SgemmKernel sgemm_kernel();                  // the one in use
void set_sgemm_kernel(SgemmKernel k);        // for tests and benchmarks; unsupported: an error

// The bf16 kernel gemm_bf16 takes (bgemm.h): AMX tiles where the CPU has AMX-BF16 and Linux
// grants the process the tile state, else AVX512_BF16's vdpbf16ps. WEFT_CPU_BF16_GEMM=amx|
// avx512bf16 picks one by hand; a bad value is an error at the first bf16 GEMM (or check_kernel_choices).
enum class BgemmKernel { avx512bf16, amx };
const char* bgemm_kernel_name(BgemmKernel k);
bool bgemm_kernel_supported(BgemmKernel k);  // bf16_gemm_native(), and for amx the tiles
BgemmKernel bgemm_kernel();
void set_bgemm_kernel(BgemmKernel k);
// Throws now, not at the first product that reads it, where WEFT_CPU_GEMM or WEFT_CPU_BF16_GEMM
// names a kernel this CPU cannot run (so a program can fail before it reads its inputs).
void check_kernel_choices();

// Tensor-level kernels behind kernels::matmul / kernels::gemm (checked by the caller). a [..., m, k] and b [..., k, n]
// with batch dims broadcastable to out's [batch..., m, n]; out is contiguous. Any float dtype (bf16 on the bf16 kernel
// where native, else 16-bit ones go through f32).
void matmul(const Tensor& a, const Tensor& b, const Tensor& out);
void dot(const Tensor& a, const Tensor& b, const Tensor& out);                              // 1-D, out 0-dim
// 2-D; returns whether it wrote a_sums (kernels/backend.h).
bool gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, const Tensor& bias,
          const Tensor& a_sums);

}  // namespace weft::kernels::cpu
