// kernels/cpu: 16-lane f32 helpers for the hand-vectorised AVX-512 loops (bf16 GELU, the bf16
// attention loops): fast_math.h's exp, and bf16 loads and stores. Forced inline, as fast_math.h.
#pragma once
#include <immintrin.h>

#include <initializer_list>

#include "kernels/cpu/fast_math.h"
// gcc 12 reports false "may be used uninitialized" warnings for the undefined pass-through
// operand inside its own AVX-512 widening and shift intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace weft::kernels::cpu {

// e^x in each lane: exp_f32's reduction x = n ln2 + r and polynomial, 2^n applied by vscalefps (which also gives 0 far
// below the range and inf above it, so exp_f32's range selects become one clamp). Within a few ulp of exp_f32; results
// below 2^-149 round to 0 or the smallest subnormal, where exp_f32 flushes below -103.97. NaN stays NaN: vmaxps returns
// its second operand when either is NaN.
WEFT_MATH_INLINE __m512 exp_x16(__m512 x) {
  const __m512 t = _mm512_max_ps(_mm512_set1_ps(-110.f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), t);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_scalef_ps(_mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f)), n);
}

// 16 bf16 values at p widened to f32.
WEFT_MATH_INLINE __m512 load_bf16x16(const void* p) {
  const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Each lane rounded to bf16 and widened back, as BFloat16(float) rounds: nearest even, NaN kept (quiet), subnormals kept.
WEFT_MATH_INLINE __m512 round_bf16_x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v), lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xffff0000u))));
}
// 16 f32 values rounded to bf16 at p: nearest even, NaN kept (as core/half.h).
WEFT_MATH_INLINE void store_bf16x16(void* p, __m512 v) {
#ifdef __AVX512BF16__  // one instruction; it flushes results below f32's normal range to 0
  _mm256_storeu_si256(static_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
#else
  const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_bf16_x16(v)), 16);
  _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
#endif
}

}  // namespace weft::kernels::cpu
