// kernels/cpu: weft's bf16 GEMM kernels: bf16 inputs, products and sums in f32, the result stored as f32 or rounded to
// bf16. bgemm_avx512bf16.cpp (vdpbf16ps, compiled for AVX512_BF16) and bgemm_amx.cpp (AMX tiles, tdpbf16ps; Intel since
// Sapphire Rapids). gemm.cpp picks AMX where the CPU has it, else AVX512_BF16; elsewhere bf16 products convert to f32
// and take the f32 kernels. Like sgemm.h: no inline code here.
#pragma once
#include <atomic>
#include <cstdint>

namespace weft::kernels::cpu {

// c[m, n] (row-major, leading dim ldc) = alpha * a b + beta * c, with a[i, p] at a[i * a_rs + p * a_cs] and b[p, j] at
// b[p * b_rs + j * b_cs] (bf16 bits; any transpose or leading dim). c is f32, or bf16 bits when c_bf16 (then beta
// reads, and the result rounds to nearest even into, bf16). beta == 0 never reads c. bias (n values of c's type, or
// null) is added to every row: alpha a b + beta c + bias, rounded once. As the instruction does, subnormal inputs and
// products count as zero. Serial: the caller splits work over threads. k >= 1. a_sums (m values, or null; only for a
// column-major a: a_rs == 1, a_cs != 1): a_sums[i] += the sum of a[i, 0..k), in f32 over each 64 values of p from 0,
// each 64 values' total added in f64 (a linear layer's bias gradient, the sums of dY's columns, taken as dY^T is packed
// for the weight gradient instead of read again).
void bgemm_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                      const uint16_t* b, int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc,
                      float alpha, float beta, const void* bias, double* a_sums);
// The same product for 1-4 rows of a row-major a times a b of contiguous columns (b_rs == 1: a
// Linear's W^T), a_sums null: b read in place (decode's products; gemm.cpp's choice, AMX or not).
void bgemm_few_rows_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                               const uint16_t* b, int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc,
                               float alpha, float beta, const void* bias, double* a_sums);
// The same product (a_sums null) for few rows of c (a LoRA adapter's rank; any m, 16 rows a pass) times a
// row-major b (b_cs 1) read in place, its pairs formed in registers: no packing of the large operand,
// each 16 columns summed over all of k in one chain. c_transposed: c[i, j] at c + j ldc + i and the
// bias along c's rows (C = A B with few columns and a column-major A, as C^T = B^T A^T).
void bgemm_skinny_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                             const uint16_t* b, int64_t b_rs, void* c, bool c_bf16, int64_t ldc, bool c_transposed,
                             float alpha, float beta, const void* bias);
// The same product on AMX tiles: only after Linux has granted the process the tile state
// (gemm.cpp asks, arch_prctl ARCH_REQ_XCOMP_PERM). A bias needs beta == 0: it is written into c
// first, and the product added onto it. a_sums must be null (not taken here).
void bgemm_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
               int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc, float alpha, float beta,
               const void* bias, double* a_sums);

// How many f32 sums a bf16 result deeper than one depth block is summed in at a time (4 Mi, 16 MB;
// bgemm_pack.h); defined in gemm.cpp. Tests set it small to reach several blocks on small shapes.
extern std::atomic<int64_t> bgemm_sum_block;

}  // namespace weft::kernels::cpu
