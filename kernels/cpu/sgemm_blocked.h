// kernels/cpu: the cache-blocked driver behind the f32 GEMM kernels: B copied into packed KC x NR micro-panels, each
// reused for a whole MC x KC block of A (which stays in L2), and an MR x NR register tile per step. Which micro-panel
// stays in L1 while the other streams from L2 is the kernel's choice (K::kStreamB). Included only by the ISA files
// (sgemm_*.cpp): everything here has internal linkage, so each gets its own copy built with its own flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/gemm_scratch.h"
#include "kernels/cpu/sgemm.h"

namespace weft::kernels::cpu {
namespace {

// One packed panel of W values per step: out[p * W + r] = x[r * r_st + p * p_st] for r < rows,
// p < kc, and 0 for rows <= r < W. The two common layouts get vector copies: steps contiguous
// (a row-major a, a transposed b) in 4 x 4 transposed blocks, or rows contiguous as whole steps.
template <int W>
void pack_panel(int64_t kc, int64_t rows, const float* x, int64_t r_st, int64_t p_st, float* out) {
  int64_t p = 0, r0 = 0;
  if (rows == W && r_st == 1) {
    for (r0 = W; p < kc; ++p) __builtin_memcpy(out + p * W, x + p * p_st, sizeof(float) * W);
  } else if (p_st == 1) {
    r0 = rows / 4 * 4;
    for (; p + 4 <= kc; p += 4)
      for (int64_t r = 0; r < r0; r += 4) {
        const float* s = x + r * r_st + p;
        __m128 v0 = _mm_loadu_ps(s), v1 = _mm_loadu_ps(s + r_st), v2 = _mm_loadu_ps(s + 2 * r_st),
               v3 = _mm_loadu_ps(s + 3 * r_st);
        _MM_TRANSPOSE4_PS(v0, v1, v2, v3);
        _mm_storeu_ps(out + p * W + r, v0);
        _mm_storeu_ps(out + (p + 1) * W + r, v1);
        _mm_storeu_ps(out + (p + 2) * W + r, v2);
        _mm_storeu_ps(out + (p + 3) * W + r, v3);
      }
  }
  for (int64_t q = 0; q < kc; ++q)  // whatever the vector paths left
    for (int64_t r = q < p ? r0 : 0; r < W; ++r) out[q * W + r] = r < rows ? x[r * r_st + q * p_st] : 0.0f;
}

// The same from bf16 x: widened along its contiguous direction into the thread's buffer, then packed as f32.
template <int W>
void pack_panel(int64_t kc, int64_t rows, const uint16_t* x, int64_t r_st, int64_t p_st, float* out) {
  static thread_local Scratch<float> wide;
  float* w = wide.get(kc * rows);
  const bool steps = p_st == 1;  // w[r * kc + p], else w[p * rows + r]
  for (int64_t o = 0; o < (steps ? rows : kc); ++o)
    for (int64_t i = 0; i < (steps ? kc : rows); ++i)
      w[o * (steps ? kc : rows) + i] = from_bf16(steps ? x[o * r_st + i] : x[i * r_st + o * p_st]);
  pack_panel<W>(kc, rows, w, steps ? kc : 1, steps ? 1 : rows, out);
}

// One full MR x NR tile of c (NR = NV vectors of V::W floats) from kc steps: per step NV vectors of the packed b panel
// and MR broadcasts of a feed MR NV FMAs into register accumulators; a[i, p] is at a[i * a_row + p * a_step] (a packed
// panel: a_row 1, a_step MR). V: the instruction set's vector type and operations; b is prefetched PF steps ahead.
template <class V, int MR, int NV, int PF>
inline void register_tile(int64_t kc, const float* a, int64_t a_row, int64_t a_step, const float* b, float* c,
                          int64_t ldc, float alpha, float beta) {
  constexpr int W = V::W;
  typename V::T acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      acc[i][v] = V::zero();
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + v * W), _MM_HINT_T0);
    }
  for (int64_t p = 0; p < kc; ++p, a += a_step, b += NV * W) {
    typename V::T bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = V::load(b + v * W);
    if constexpr (PF > 0)
      for (int v = 0; v < NV; ++v) _mm_prefetch(reinterpret_cast<const char*>(b + (PF * NV + v) * W), _MM_HINT_T0);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const typename V::T ai = V::set1(a[i * a_row]);
      for (int v = 0; v < NV; ++v) acc[i][v] = V::fmadd(ai, bv[v], acc[i][v]);
    }
  }
  const typename V::T va = V::set1(alpha), vb = V::set1(beta);
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      float* cv = c + i * ldc + W * v;
      typename V::T r = V::mul(va, acc[i][v]);
      if (beta != 0.0f) r = V::fmadd(vb, V::loadu(cv), r);
      V::storeu(cv, r);
    }
}

// K supplies V, the register tile (MR rows x NV vectors), the block sizes MC (a multiple of MR), KC and NC, and
// kStreamB (true: a's micro-panel, packed when a is transposed, stays in L1 while b's stream past it, prefetched).
// TA, TB: float, or uint16_t for bf16 operands, widened as they are packed (a then always packed).
template <class K, class TA = float, class TB = float>
void sgemm_blocked(int64_t m, int64_t n, int64_t k, const TA* a, int64_t a_rs, int64_t a_cs, const TB* b,
                   int64_t b_rs, int64_t b_cs, float* c, int64_t ldc, float alpha, float beta) {
  constexpr int MR = K::MR, NR = K::NV * K::V::W;
  static thread_local Scratch<float> a_buf, b_buf;
  float* pa = a_buf.get(K::MC * K::KC);
  float* pb = b_buf.get(K::KC * ((std::min<int64_t>(n, K::NC) + NR - 1) / NR * NR));
  alignas(64) float edge[MR * NR];
  // A row-major a is read in place (packing: 4-10 % slower at n of a few hundred) unless it stays in
  // L1 (K::kStreamB) with rows in one L1 set (rows_share_l1_set; packed: 10-45 % faster, Zen 4); so is
  // a transposed one (X^T of a weight gradient) staying in L1, and a tail panel (missing rows 0).
  const bool in_place = std::is_same_v<TA, float> && ((a_cs == 1 && (!rows_share_l1_set<float>(a_rs) || !K::kStreamB)) ||
                                                      (a_rs == 1 && !K::kStreamB));
  for (int64_t jc = 0; jc < n; jc += K::NC) {
    const int64_t nc = std::min<int64_t>(K::NC, n - jc);
    for (int64_t pc = 0; pc < k; pc += K::KC) {
      const int64_t kc = std::min<int64_t>(K::KC, k - pc);
      const float beta_pc = pc == 0 ? beta : 1.0f;  // later k blocks accumulate onto the first
      for (int64_t j = 0; j < nc; j += NR)  // b[p, j] as panels of NR columns
        pack_panel<NR>(kc, std::min<int64_t>(NR, nc - j), b + pc * b_rs + (jc + j) * b_cs, b_cs, b_rs, pb + j * kc);
      for (int64_t ic = 0; ic < m; ic += K::MC) {
        const int64_t mc = std::min<int64_t>(K::MC, m - ic);
        for (int64_t i = in_place ? mc / MR * MR : 0; i < mc; i += MR)  // a[i, p] as panels of MR rows
          pack_panel<MR>(kc, std::min<int64_t>(MR, mc - i), a + (ic + i) * a_rs + pc * a_cs, a_rs, a_cs, pa + i * kc);
        auto tile = [&](int64_t ir, int64_t jr) {
          const int64_t mr = std::min<int64_t>(MR, mc - ir), nr = std::min<int64_t>(NR, nc - jr);
          const bool direct = in_place && mr == MR;
          const float* ap = pa + ir * kc;
          if constexpr (std::is_same_v<TA, float>) ap = direct ? a + (ic + ir) * a_rs + pc * a_cs : ap;
          const int64_t a_row = direct ? a_rs : 1, a_step = direct ? a_cs : MR;
          const float* bp = pb + jr * kc;
          float* cp = c + (ic + ir) * ldc + jc + jr;
          if (mr == MR && nr == NR)
            return register_tile<typename K::V, MR, K::NV, K::kStreamB * 8>(kc, ap, a_row, a_step, bp, cp, ldc, alpha,
                                                                             beta_pc);
          // A tail tile: the full tile into `edge`, then only its valid part into c, rounded
          // as a full tile is (one fused multiply-add), so that its place in C cannot matter.
          register_tile<typename K::V, MR, K::NV, 0>(kc, ap, a_row, a_step, bp, edge, NR, 1.0f, 0.0f);
          for (int64_t i = 0; i < mr; ++i)
            for (int64_t j = 0; j < nr; ++j) {
              float v = alpha * edge[i * NR + j];
              cp[i * ldc + j] = beta_pc == 0.0f ? v : __builtin_fmaf(beta_pc, cp[i * ldc + j], v);
            }
        };
        for (int64_t outer = 0; outer < (K::kStreamB ? mc : nc); outer += (K::kStreamB ? MR : NR))
          for (int64_t inner = 0; inner < (K::kStreamB ? nc : mc); inner += (K::kStreamB ? NR : MR))
            K::kStreamB ? tile(outer, inner) : tile(inner, outer);
      }
    }
  }
}

}  // namespace
}  // namespace weft::kernels::cpu
