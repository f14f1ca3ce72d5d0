// kernels/cpu: weft's own f32 GEMM kernels, one per instruction set, each in its own translation unit compiled for that
// set only (sgemm_avx2.cpp, sgemm_avx512.cpp). gemm.cpp picks one at run time from what the CPU has. Keep this header
// free of Eigen and of inline code: whatever an ISA file inlines is compiled with that file's flags.
#pragma once
#include <cstdint>

namespace weft::kernels::cpu {

// c[m, n] (row-major, leading dim ldc) = alpha * a b + beta * c, with a[i, p] at
// a[i * a_rs + p * a_cs] and b[p, j] at b[p * b_rs + j * b_cs] (any transpose or leading dim).
// beta == 0 never reads c. Serial: the caller splits work over threads. k >= 1.
using SgemmFn = void (*)(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                         const float* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);
void sgemm_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);
void sgemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);  // 12 x 32 tile
void sgemm_avx512_8x48(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                       int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);

// The same with bf16 a and b (their bits), widened to f32 as the kernel packs them: bitwise the product of f32 copies.
using SgemmBf16Fn = void (*)(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                             const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha,
                             float beta);
void sgemm_avx2_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                     const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);
void sgemm_avx512_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                       const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta);
void sgemm_avx512_8x48_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                            const uint16_t* b, int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha,
                            float beta);

}  // namespace weft::kernels::cpu
