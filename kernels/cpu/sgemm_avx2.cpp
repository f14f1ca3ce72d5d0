// kernels/cpu: the AVX2 + FMA f32 GEMM kernel: a 6 x 16 register tile (12 ymm accumulators,
// two B vectors and one broadcast fill the 16 registers). Compiled with -mavx2 -mfma and
// called only when the CPU has both (gemm.cpp); it includes nothing built for another set.
#include <immintrin.h>

#include "kernels/cpu/sgemm_blocked.h"

namespace weft::kernels::cpu {
namespace {

struct Avx2 {
  static constexpr int MR = 6, NR = 16;
  static constexpr int64_t MC = 96, KC = 256, NC = 2048;
  static void tile(int64_t kc, const float* a, int64_t a_row, int64_t a_step, const float* b, float* c, int64_t ldc,
                   float alpha, float beta) {
    __m256 acc[MR][2];
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = acc[i][1] = _mm256_setzero_ps();
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 8), _MM_HINT_T0);
    }
    for (int64_t p = 0; p < kc; ++p, a += a_step, b += NR) {
      const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a + i * a_row);
        acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
      }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < 2; ++v) {
        float* cv = c + i * ldc + 8 * v;
        __m256 r = _mm256_mul_ps(va, acc[i][v]);
        if (beta != 0.0f) r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cv), r);
        _mm256_storeu_ps(cv, r);
      }
  }
};

}  // namespace

void sgemm_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Avx2>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

}  // namespace weft::kernels::cpu
