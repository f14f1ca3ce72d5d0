// kernels/cpu: the AVX-512 f32 GEMM kernels, two register tiles of 24 zmm accumulators: 12 x 32 (12 broadcasts of A and
// two vectors of B per step) and 8 x 48 (8 broadcasts, three vectors: 11 loads for 24 FMAs, not 14). gemm.cpp takes
// the 8 x 48 on Intel (Ice Lake: 6-18 % faster, docs/PERFORMANCE.md) and the 12 x 32 elsewhere. Compiled with
// -mavx512f and called only when the CPU has it; it includes nothing built for another instruction set.
#include "kernels/cpu/sgemm_blocked.h"  // and <immintrin.h>

namespace weft::kernels::cpu {
namespace {

struct Vec {
  using T = __m512;
  static constexpr int W = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T mul(T x, T y) { return _mm512_mul_ps(x, y); }
  static T fmadd(T x, T y, T z) { return _mm512_fmadd_ps(x, y, z); }
};

struct Kernel12x32 {
  using V = Vec;
  static constexpr int MR = 12, NV = 2;
  // a's block (288 KB) stays in L2; KC 512, not 256, halves the passes over c (Zen 5: 2-4 %); NC 512, not 2048, keeps
  // b's packed panel at 1 MB (3-5 % with both cores busy). b's 64 KB micro-panel outgrows L1, so it streams past a's
  // (Intel, 2 MB L2: 10-20 % faster, weight gradients twice as fast with a^T packed; docs/PERFORMANCE.md).
  static constexpr int64_t MC = 144, KC = 512, NC = 512;
  static constexpr bool kStreamB = true;
};

// b's micro-panel (48 KB at KC 256) streams past a's 8 KB one; KC 512, NC 480 or 1,440 and prefetch distances 4, 12
// and 16 were no faster on Ice Lake. NC 960 keeps b's packed panel at 960 KB, inside its 1.25 MB L2.
struct Kernel8x48 {
  using V = Vec;
  static constexpr int MR = 8, NV = 3;
  static constexpr int64_t MC = 144, KC = 256, NC = 960;
  static constexpr bool kStreamB = true;
};

}  // namespace

void sgemm_avx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel12x32>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

void sgemm_avx512_8x48(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                       int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel8x48>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

void sgemm_avx512_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
                       int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel12x32>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

void sgemm_avx512_8x48_bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
                            int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  sgemm_blocked<Kernel8x48>(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, alpha, beta);
}

}  // namespace weft::kernels::cpu
