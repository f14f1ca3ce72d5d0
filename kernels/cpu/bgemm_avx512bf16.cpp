// kernels/cpu: the bf16 GEMM kernel for CPUs with AVX512_BF16 (bgemm.h). The driver is the
// f32 kernels' (sgemm_blocked.h) with k taken in pairs: vdpbf16ps multiplies 16 pairs of bf16
// and adds both products to 16 f32 accumulators, so B is packed as NR-column panels holding
// (b[2q, j], b[2q+1, j]) side by side, and each row of A gives one broadcast pair per step. A
// 12 x 32 register tile (24 zmm accumulators). Compiled with -mavx512bf16 and called only
// when the CPU has it (gemm.cpp); it includes nothing built for another instruction set.
#include <immintrin.h>

#include <cstdint>
// gcc 12 reports false "may be used uninitialized" warnings for the undefined pass-through
// operand inside its own AVX-512 widening and shift intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cstring>
#include <vector>

#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

constexpr int MR = 12, NR = 32;
// a's MC x KC block (576 KB of bf16) stays in L2 with b's KC x NR micro-panel (128 KB): a
// depth that covers the GPT's products in one block, since every further block reloads c.
// Against KC 512 (both in L1/L2 at half the size) it measured 86-94 % of the bf16 dot peak
// instead of 80-91 % on a Zen 4 (1 MB L2), at 1024^3 and the GPT medium shapes.
constexpr int64_t MC = 144, KC = 2048, NC = 512;  // KC even: whole pairs

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }


// f32 to bf16 bits, round to nearest even, NaN kept a (quiet) NaN: as core/half.h.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Interleaves the first `lanes` (<= 32) values of rows x0 and x1 into out[2 l] = x0[l],
// out[2 l + 1] = x1[l]; x1 null reads as zeros. Masked loads never touch beyond the lanes.
inline void interleave_pairs(const uint16_t* x0, const uint16_t* x1, int lanes, uint16_t* out) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                             6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  const __mmask32 m = lanes >= 32 ? ~__mmask32(0) : (__mmask32(1) << lanes) - 1;
  const __m512i r0 = _mm512_maskz_loadu_epi16(m, x0);
  const __m512i r1 = x1 ? _mm512_maskz_loadu_epi16(m, x1) : _mm512_setzero_si512();
  const __mmask32 m0 = lanes >= 16 ? ~__mmask32(0) : (__mmask32(1) << (2 * lanes)) - 1;
  _mm512_mask_storeu_epi16(out, m0, _mm512_permutex2var_epi16(r0, lo, r1));
  if (lanes > 16) {
    const __mmask32 m1 = lanes >= 32 ? ~__mmask32(0) : (__mmask32(1) << (2 * (lanes - 16))) - 1;
    _mm512_mask_storeu_epi16(out + 32, m1, _mm512_permutex2var_epi16(r0, hi, r1));
  }
}

// One packed panel of W lanes (rows of A, or columns of B) for kc steps of k, in pairs:
// out[q * 2W + 2 l + h] = x[l * l_st + (2q + h) * k_st] for l < lanes, 2q + h < kc, else 0.
// Lanes contiguous (l_st 1) interleave two k rows at a time; pairs contiguous (k_st 1) copy
// 32-bit words; any other layout goes element by element.
template <int W>
void pack_pairs(int64_t kc, int64_t lanes, const uint16_t* x, int64_t l_st, int64_t k_st, uint16_t* out) {
  const int64_t kc2 = (kc + 1) / 2;
  if (lanes < W) std::memset(out, 0, size_t(kc2) * 2 * W * sizeof(uint16_t));
  if (l_st == 1) {
    for (int64_t q = 0; q < kc2; ++q)
      interleave_pairs(x + 2 * q * k_st, 2 * q + 1 < kc ? x + (2 * q + 1) * k_st : nullptr, int(lanes),
                       out + q * 2 * W);
    return;
  }
  for (int64_t l = 0; l < lanes; ++l) {
    const uint16_t* xl = x + l * l_st;
    uint16_t* o = out + 2 * l;
    if (k_st == 1) {
      for (int64_t q = 0; q < kc / 2; ++q) std::memcpy(o + q * 2 * W, xl + 2 * q, 4);
    } else {
      for (int64_t q = 0; q < kc / 2; ++q) {
        o[q * 2 * W] = xl[2 * q * k_st];
        o[q * 2 * W + 1] = xl[(2 * q + 1) * k_st];
      }
    }
    if (kc % 2) {
      o[(kc / 2) * 2 * W] = xl[(kc - 1) * k_st];
      o[(kc / 2) * 2 * W + 1] = 0;
    }
  }
}

inline __m512 load_c(const void* c, bool c16) {
  if (!c16) return _mm512_loadu_ps(static_cast<const float*>(c));
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(c)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void store_c(void* c, bool c16, __m512 v) {
  if (!c16) return _mm512_storeu_ps(static_cast<float*>(c), v);
  _mm256_storeu_si256(static_cast<__m256i*>(c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// One full MR x NR tile of c from kc2 pair steps: per step two vectors of the packed b panel
// and MR broadcast pairs of a feed 2 MR vdpbf16ps into register accumulators; the pair
// a[i, 2q..2q+1] is at a + i * a_row + q * a_step (a packed panel: a_row 2, a_step 2 MR).
inline void register_tile(int64_t kc2, const uint16_t* a, int64_t a_row, int64_t a_step, const uint16_t* b,
                          void* c, bool c16, int64_t ldc, float alpha, float beta) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t q = 0; q < kc2; ++q, a += a_step, b += 2 * NR) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(b + NR));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + i * a_row, 4);
      const __m512bh ai = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const int64_t es = c16 ? 2 : 4;
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < 2; ++v) {
      char* cv = static_cast<char*>(c) + (i * ldc + 16 * v) * es;
      __m512 r = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, load_c(cv, c16), r);
      store_c(cv, c16, r);
    }
}

// The blocked product into f32 or bf16 c; with bf16 c, k must fit one KC block (later blocks
// would accumulate through bf16).
void blocked(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
             int64_t b_rs, int64_t b_cs, void* c, bool c16, int64_t ldc, float alpha, float beta) {
  static thread_local Scratch<uint16_t> a_buf, b_buf;
  const int64_t kc2_max = (min64(k, KC) + 1) / 2;
  uint16_t* pa = a_buf.get(MC * 2 * kc2_max);
  uint16_t* pb = b_buf.get(2 * kc2_max * ((min64(n, NC) + NR - 1) / NR * NR));
  alignas(64) float edge[MR * NR];
  const int64_t es = c16 ? 2 : 4;
  for (int64_t jc = 0; jc < n; jc += NC) {
    const int64_t nc = min64(NC, n - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = min64(KC, k - pc), kc2 = (kc + 1) / 2;
      const float beta_pc = pc == 0 ? beta : 1.0f;  // later k blocks accumulate onto the first
      for (int64_t j = 0; j < nc; j += NR)
        pack_pairs<NR>(kc, min64(NR, nc - j), b + pc * b_rs + (jc + j) * b_cs, b_cs, b_rs, pb + j * 2 * kc2);
      // Full panels of a row-major a are read in place (pairs are adjacent); the rest is packed.
      const bool in_place = a_cs == 1 && kc % 2 == 0;
      for (int64_t ic = 0; ic < m; ic += MC) {
        const int64_t mc = min64(MC, m - ic);
        for (int64_t i = in_place ? mc / MR * MR : 0; i < mc; i += MR)
          pack_pairs<MR>(kc, min64(MR, mc - i), a + (ic + i) * a_rs + pc * a_cs, a_rs, a_cs, pa + i * 2 * kc2);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = min64(MR, mc - ir), nr = min64(NR, nc - jr);
            const bool direct = in_place && mr == MR;
            const uint16_t* ap = direct ? a + (ic + ir) * a_rs + pc : pa + ir * 2 * kc2;
            const int64_t a_row = direct ? a_rs : 2, a_step = direct ? 2 : 2 * MR;
            const uint16_t* bp = pb + jr * 2 * kc2;
            char* cp = static_cast<char*>(c) + ((ic + ir) * ldc + jc + jr) * es;
            if (mr == MR && nr == NR) {
              register_tile(kc2, ap, a_row, a_step, bp, cp, c16, ldc, alpha, beta_pc);
              continue;
            }
            // A tail tile: the full tile into `edge`, then only its valid part into c.
            register_tile(kc2, ap, a_row, a_step, bp, edge, false, NR, 1.0f, 0.0f);
            for (int64_t i = 0; i < mr; ++i)
              for (int64_t j = 0; j < nr; ++j) {
                const float v = alpha * edge[i * NR + j];
                if (c16) {
                  uint16_t* o = reinterpret_cast<uint16_t*>(cp) + i * ldc + j;
                  *o = to_bf16(beta_pc == 0.0f ? v : v + beta_pc * from_bf16(*o));
                } else {
                  float* o = reinterpret_cast<float*>(cp) + i * ldc + j;
                  *o = beta_pc == 0.0f ? v : v + beta_pc * *o;
                }
              }
          }
        }
      }
    }
  }
}

}  // namespace

void bgemm_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                      const uint16_t* b, int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc,
                      float alpha, float beta) {
  if (!c_bf16 || k <= KC) return blocked(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, c_bf16, ldc, alpha, beta);
  // A bf16 result over several k blocks: sum in f32, round once.
  std::vector<float> sum(size_t(m * n));
  uint16_t* c16 = static_cast<uint16_t*>(c);
  blocked(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, sum.data(), false, n, alpha, 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float v = sum[size_t(i * n + j)];
      c16[i * ldc + j] = to_bf16(beta == 0.0f ? v : v + beta * from_bf16(c16[i * ldc + j]));
    }
}

}  // namespace weft::kernels::cpu
