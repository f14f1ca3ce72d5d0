// kernels/cpu: the bf16 GEMM kernel for CPUs with AVX512_BF16 (bgemm.h). The driver is the f32 kernels'
// (sgemm_blocked.h) with k taken in pairs: vdpbf16ps multiplies 16 pairs of bf16 and adds both products to 16 f32
// accumulators, so B is packed as NR-column panels holding (b[2q, j], b[2q+1, j]) side by side, and each row of A gives
// one broadcast pair per step. A 12 x 32 register tile (24 zmm accumulators). Compiled with -mavx512bf16 and called
// only when the CPU has it (gemm.cpp); it includes nothing built for another instruction set.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
// gcc 12 reports false "may be used uninitialized" warnings for the undefined pass-through
// operand inside its own AVX-512 widening, shift and reduction intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <cstring>

#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/bgemm_pack.h"
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

constexpr int MR = 12, NR = 32;
// a's MC x KC block (576 KB of bf16) stays in L2 with b's KC x NR micro-panel (128 KB): a depth that covers the GPT's
// products in one block, since every further block reloads c. Against KC 512 (both in L1/L2 at half the size) it
// measured 86-94 % of the bf16 dot peak instead of 80-91 % on a Zen 4 (1 MB L2), at 1024^3 and the GPT medium shapes.
constexpr int64_t MC = 144, KC = 2048, NC = 512;  // KC even: whole pairs
constexpr int64_t kKeepA = int64_t(8) << 20;        // elements (16 MiB)

// One full MR x 16 NV tile of c from kc2 pair steps: per step NV vectors of the packed b panel and MR broadcast pairs
// of a feed NV MR vdpbf16ps into register accumulators (NV 1 for a panel of at most 16 columns: a LoRA adapter's
// rank-16 products, which with NV 2 ran half idle). The pair a[i, 2q..2q+1] is at a + 2 (MR q + i) in a packed panel
// (Packed), else at a + i a_row + 2 q in a row-major a read in place, addressed from four row pointers (rows 3g, 3g +
// 1, 3g + 2 at p_g, p_g + a_row, p_g + 2 a_row): with one offset per row the loop ran out of registers and reloaded its
// bound and a stride from memory on every step.
template <bool Packed, int NV>
void register_tile(int64_t kc2, const uint16_t* a, int64_t a_row, const uint16_t* b, void* c, bool c16, int64_t ldc,
                   float alpha, float beta, const void* bias) {
  __m512 acc[MR][NV];
  for (auto& row : acc)
    for (__m512& v : row) v = _mm512_setzero_ps();
  const uint16_t* p[MR / 3];
  for (int g = 0; g < MR / 3; ++g) p[g] = a + 3 * g * a_row;
  for (int64_t q = 0; q < kc2; ++q, b += 2 * NR) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(b));
    const __m512bh b1 = NV == 2 ? reinterpret_cast<__m512bh>(_mm512_load_si512(b + NR)) : b0;
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, Packed ? a + 2 * (MR * q + i) : p[i / 3] + (i % 3) * a_row, 4);
      const __m512bh ai = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      if constexpr (NV == 2) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
    if constexpr (!Packed)
      for (int g = 0; g < MR / 3; ++g) p[g] += 2;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const int64_t es = c16 ? 2 : 4;
  const __m512 bv[2] = {bias ? load_c(bias, c16) : va,
                        NV == 2 && bias ? load_c(static_cast<const char*>(bias) + 16 * es, c16) : va};
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      char* cv = static_cast<char*>(c) + (i * ldc + 16 * v) * es;
      __m512 r = _mm512_mul_ps(va, acc[i][v]);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, load_c(cv, c16), r);
      if (bias) r = _mm512_add_ps(r, bv[v]);
      store_c(cv, c16, r);
    }
}

// register_tile by [read in place][vectors - 1]
constexpr decltype(&register_tile<true, 2>) kTiles[2][2] = {{register_tile<true, 1>, register_tile<true, 2>},
                                                            {register_tile<false, 1>, register_tile<false, 2>}};

// The blocked product into f32 or bf16 c; with bf16 c, k must fit one KC block (later blocks
// would accumulate through bf16). The bias joins the first depth block, as beta does; a's row
// sums (bgemm.h) come from packing a column-major a for the first column block.
void blocked(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
             int64_t b_rs, int64_t b_cs, void* c, bool c16, int64_t ldc, float alpha, float beta, const void* bias,
             double* a_sums) {
  static thread_local Scratch<uint16_t> a_buf, b_buf;
  const int64_t kc2_max = (std::min<int64_t>(k, KC) + 1) / 2;
  // A column-major a (the weight gradient's dY^T) is packed once for all column blocks when
  // there are several and it fits kKeepA, else again for each block: of 2 NC columns, which
  // halves that (the 50,257-row head's dW at 768 columns: one block, +8-10 % on a Zen 5).
  const bool lanes_a = a_rs == 1 && a_cs != 1;
  const int64_t m_up = (m + MR - 1) / MR * MR, k_blocks = (k + KC - 1) / KC, nc_max = lanes_a ? 2 * NC : NC;
  const bool keep_a = lanes_a && n > nc_max && m_up * k_blocks * 2 * kc2_max <= kKeepA;
  uint16_t* pa = a_buf.get(keep_a ? m_up * k_blocks * 2 * kc2_max : MC * 2 * kc2_max);
  uint16_t* pb = b_buf.get(2 * kc2_max * ((std::min<int64_t>(n, nc_max) + NR - 1) / NR * NR));
  alignas(64) float edge[MR * NR];
  const int64_t es = c16 ? 2 : 4;
  for (int64_t jc = 0; jc < n; jc += nc_max) {
    const int64_t nc = std::min<int64_t>(nc_max, n - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min<int64_t>(KC, k - pc), kc2 = (kc + 1) / 2;
      const float beta_pc = pc == 0 ? beta : 1.0f;  // later k blocks accumulate onto the first
      const char* bias_pc = pc == 0 ? static_cast<const char*>(bias) : nullptr;
      pack_panels<NR>(kc, nc, b + pc * b_rs + jc * b_cs, b_cs, b_rs, pb, NR * 2 * kc2);
      // Full panels of a row-major a are read in place (pairs are adjacent); the rest is packed,
      // and so is all of an a whose rows share one L1 set (rows_share_l1_set: 2048 x 2048 x 512 +4 %).
      const bool in_place = a_cs == 1 && kc % 2 == 0 && !rows_share_l1_set<uint16_t>(a_rs);
      for (int64_t ic = 0; ic < m; ic += MC) {
        const int64_t mc = std::min<int64_t>(MC, m - ic);
        uint16_t* pa_ic = keep_a ? pa + (pc / KC * m_up * kc2_max + ic * kc2) * 2 : pa;
        if (lanes_a) {
          if (!keep_a || jc == 0)
            pack_pairs_lanes<MR>(kc, mc, a + ic + pc * a_cs, a_cs, pa_ic, a_sums && jc == 0 ? a_sums + ic : nullptr);
        } else
          for (int64_t i = in_place ? mc / MR * MR : 0; i < mc; i += MR)
            pack_pairs<MR>(kc, std::min<int64_t>(MR, mc - i), a + (ic + i) * a_rs + pc * a_cs, a_rs, a_cs, pa + i * 2 * kc2);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = std::min<int64_t>(MR, mc - ir), nr = std::min<int64_t>(NR, nc - jr);
            const bool direct = in_place && mr == MR;
            const uint16_t* bp = pb + jr * 2 * kc2;
            char* cp = static_cast<char*>(c) + ((ic + ir) * ldc + jc + jr) * es;
            // A tail tile: the full tile into `edge`, then only its valid part into c.
            const int nv = nr <= 16 ? 1 : 2;  // vectors of 16 columns per tile row
            const bool full = mr == MR && nr == 16 * nv;
            void* out = full ? static_cast<void*>(cp) : edge;
            const int64_t ld = full ? ldc : NR;
            const float al = full ? alpha : 1.0f, be = full ? beta_pc : 0.0f;
            const char* bias_j = bias_pc ? bias_pc + (jc + jr) * es : nullptr;
            const void* bi = full ? bias_j : nullptr;
            if (direct) kTiles[1][nv - 1](kc2, a + (ic + ir) * a_rs + pc, a_rs, bp, out, full && c16, ld, al, be, bi);
            else kTiles[0][nv - 1](kc2, pa_ic + ir * 2 * kc2, 2, bp, out, full && c16, ld, al, be, bi);
            if (!full) store_tail(edge, NR, mr, nr, cp, c16, ldc, alpha, beta_pc, bias_j);
          }
        }
      }
    }
  }
}

// bgemm_few_rows_avx512bf16's M rows (the blocked product would pack all of b on every call: a bf16 decode of Llama 3.2
// 1B's shape, Zen 4, 2 threads, 5.2 tokens/s so, 13.4 so). Column after column (one stream; four side by side read 25 %
// fewer bytes a second), 128 values a step in four vector chains against the rows' same values (in L1); b prefetched
// into L2 2 KiB ahead, past the page ends where the hardware's prefetch stops (Zen 4, 1 thread: a 1B bf16 decode +7 %,
// docs/PERFORMANCE.md). A sum is one column's: its bits do not depend on the columns beside it or the threads' split.
template <int M>
void few_rows(int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, const uint16_t* b, int64_t b_cs, void* c,
              bool c16, int64_t ldc, float alpha, float beta, const void* bias) {
  const int64_t es = c16 ? 2 : 4;
  for (int64_t j = 0; j < n; ++j, b += b_cs) {
    __m512 acc[M][4] = {};
    for (int64_t p = 0; p < k; p += 128)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        const int64_t q = p + 32 * u, left = k - q;
        _mm_prefetch(reinterpret_cast<const char*>(b + q + 1024), _MM_HINT_T2);  // never faults, even past b's end
        const __mmask32 valid = left >= 32 ? ~__mmask32(0) : left <= 0 ? 0 : (__mmask32(1) << left) - 1;
        const __m512bh w = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(valid, b + q));
        for (int i = 0; i < M; ++i)
          acc[i][u] = _mm512_dpbf16_ps(acc[i][u], reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(valid, a + i * a_rs + q)), w);
      }
    float sum[M];
    for (int i = 0; i < M; ++i)
      sum[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3])));
    store_tail(sum, 1, M, 1, static_cast<char*>(c) + j * es, c16, ldc, alpha, beta,
               bias ? static_cast<const char*>(bias) + j * es : nullptr);
  }
}

// skinny's pass over up to 16 rows of a (M accumulators: 8 or 16), as pair words
// (a[i, 2q], a[i, 2q + 1]) at pairs + 2 (16 q + i): 16 columns of b at a time over all of k, in
// order. Rows 2q and 2q + 1 of b are interleaved in registers as they are read.
template <int M>
void skinny_pass(int64_t m, int64_t n, int64_t k, const uint16_t* pairs, const uint16_t* b, int64_t b_rs, char* c,
                 bool c16, int64_t ldc, bool c_transposed, float alpha, float beta, const void* bias) {
  const __m512i idx = pair_lanes_index();
  const int64_t es = c16 ? 2 : 4;
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    const int64_t nl = std::min<int64_t>(16, n - j0);
    const __mmask16 live = nl == 16 ? __mmask16(0xffff) : __mmask16((1u << nl) - 1);
    __m512 acc[M];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    const uint16_t* row = b + j0;
    for (int64_t q = 0; q < (k + 1) / 2; ++q, row += 2 * b_rs) {
      // rows a page apart are not prefetched by the hardware: into L1 16 steps ahead, into L2 64 (b in memory, not
      // cache: a LoRA dA's x saved by the forward, 1.6 MB at Llama medium, 134 -> 183-190 GFLOP/s on a Zen 4)
      for (int64_t ahead : {32, 33}) _mm_prefetch(reinterpret_cast<const char*>(row + ahead * b_rs), _MM_HINT_T0);
      for (int64_t ahead : {128, 129}) _mm_prefetch(reinterpret_cast<const char*>(row + ahead * b_rs), _MM_HINT_T1);
      const __m256i r0 = _mm256_maskz_loadu_epi16(live, row);
      const __m256i r1 = 2 * q + 1 < k ? _mm256_maskz_loadu_epi16(live, row + b_rs) : _mm256_setzero_si256();
      const __m512bh v = reinterpret_cast<__m512bh>(
          _mm512_permutex2var_epi16(_mm512_castsi256_si512(r0), idx, _mm512_castsi256_si512(r1)));
#pragma GCC unroll 16
      for (int i = 0; i < M; ++i) {
        int32_t pair;
        std::memcpy(&pair, pairs + 2 * (16 * q + i), 4);
        acc[i] = _mm512_dpbf16_ps(acc[i], reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair)), v);
      }
    }
    alignas(64) float sums[16][16], t[16][16];  // [row of c][column], and transposed
    for (int i = 0; i < M; ++i) _mm512_store_ps(sums[i], acc[i]);
    const char* bias_j = bias ? static_cast<const char*>(bias) + j0 * es : nullptr;
    if (!c_transposed) store_tail(sums[0], 16, m, nl, c + j0 * es, c16, ldc, alpha, beta, bias_j);
    else {
      for (int i = 0; i < m; ++i)
        for (int l = 0; l < nl; ++l) t[l][i] = sums[i][l];
      store_tail(t[0], 16, nl, m, c + j0 * ldc * es, c16, ldc, alpha, beta, bias);
    }
  }
}

}  // namespace

void bgemm_few_rows_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t,
                               const uint16_t* b, int64_t, int64_t b_cs, void* c, bool c_bf16, int64_t ldc,
                               float alpha, float beta, const void* bias, double*) {
  constexpr decltype(&few_rows<1>) by_rows[] = {few_rows<1>, few_rows<2>, few_rows<3>, few_rows<4>};
  by_rows[m - 1](n, k, a, a_rs, b, b_cs, c, c_bf16, ldc, alpha, beta, bias);
}

void bgemm_skinny_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                             const uint16_t* b, int64_t b_rs, void* c, bool c_bf16, int64_t ldc, bool c_transposed,
                             float alpha, float beta, const void* bias) {
  static thread_local Scratch<uint16_t> a_buf;
  uint16_t* pairs = a_buf.get((k + 1) / 2 * 32);
  const int64_t es = c_bf16 ? 2 : 4;
  for (int64_t i0 = 0; i0 < m; i0 += 16) {
    const int64_t rows = std::min<int64_t>(16, m - i0);
    pack_pairs<16>(k, rows, a + i0 * a_rs, a_rs, a_cs, pairs);
    char* ci = static_cast<char*>(c) + (c_transposed ? i0 : i0 * ldc) * es;
    const char* bi = bias && c_transposed ? static_cast<const char*>(bias) + i0 * es : static_cast<const char*>(bias);
    (rows <= 8 ? skinny_pass<8> : skinny_pass<16>)(rows, n, k, pairs, b, b_rs, ci, c_bf16, ldc, c_transposed, alpha,
                                                   beta, bi);
  }
}

void bgemm_avx512bf16(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs,
                      const uint16_t* b, int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc,
                      float alpha, float beta, const void* bias, double* a_sums) {
  bgemm_by_depth_blocks(blocked, KC, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, c_bf16, ldc, alpha, beta, bias, a_sums);
}

}  // namespace weft::kernels::cpu
