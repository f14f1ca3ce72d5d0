// kernels/cpu: the AVX2 + FMA f32 GEMM kernel: a 6 x 16 register tile (12 ymm accumulators,
// two B vectors and one broadcast fill the 16 registers). Compiled with -mavx2 -mfma and
// called only when the CPU has both (gemm.cpp); it includes nothing built for another set.
#include "kernels/cpu/sgemm_blocked.h"  // and <immintrin.h>

namespace weft::kernels::cpu {
namespace {

struct Vec {
  using T = __m256;
  static constexpr int W = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T mul(T x, T y) { return _mm256_mul_ps(x, y); }
  static T fmadd(T x, T y, T z) { return _mm256_fmadd_ps(x, y, z); }
};

struct Kernel {
  using V = Vec;
  static constexpr int MR = 6, NV = 2;
  static constexpr int64_t MC = 96, KC = 256, NC = 2048;
  static constexpr bool kStreamB = false;  // b's 16 KB micro-panel fits L1
};

}  // namespace

void sgemm_avx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

void sgemm_avx2_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
                     int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

}  // namespace weft::kernels::cpu
