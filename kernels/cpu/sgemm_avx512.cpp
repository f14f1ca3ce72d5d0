// kernels/cpu: the AVX-512 f32 GEMM kernel: a 12 x 32 register tile (24 zmm accumulators),
// one broadcast of A and two vectors of B per step. Compiled with -mavx512f and called only
// when the CPU has it (gemm.cpp); it includes nothing built for another instruction set.
#include <immintrin.h>

#include "kernels/cpu/sgemm_blocked.h"

namespace weft::kernels::cpu {
namespace {

struct Avx512 {
  static constexpr int MR = 12, NR = 32;
  // a's MC x KC block (288 KB) stays in L2; KC = 512 rather than 256 (b's 64 KB micro-panel
  // then streams from L2) halves the passes over c: 2-4 % faster on a Zen 5 core. NC = 512
  // rather than 2048 keeps b's packed panel at 1 MB: 3-5 % faster with both cores busy (one
  // process per core; threaded, the same).
  static constexpr int64_t MC = 144, KC = 512, NC = 512;
  static void tile(int64_t kc, const float* a, int64_t a_row, int64_t a_step, const float* b, float* c, int64_t ldc,
                   float alpha, float beta) {
    __m512 acc[MR][2];
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16), _MM_HINT_T0);
    }
    for (int64_t p = 0; p < kc; ++p, a += a_step, b += NR) {
      const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
      for (int i = 0; i < MR; ++i) {
        const __m512 ai = _mm512_set1_ps(a[i * a_row]);
        acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
      }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < 2; ++v) {
        float* cv = c + i * ldc + 16 * v;
        __m512 r = _mm512_mul_ps(va, acc[i][v]);
        if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cv), r);
        _mm512_storeu_ps(cv, r);
      }
  }
};

}  // namespace

void sgemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Avx512>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

}  // namespace weft::kernels::cpu
