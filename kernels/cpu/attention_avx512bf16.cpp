// kernels/cpu: bf16 attention with vdpbf16ps register tiles, for CPUs with AVX512_BF16 and head dims that are multiples
// of 16: the loops of attention_bf16_loops.h (which values round to bf16, the pair layouts), each product a register
// tile of f32 sums. Compiled with -mavx512bf16 in its own static library and called only when the CPU has it
// (attention.cpp); it includes nothing with out-of-line code built for another instruction set.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_bf16_loops.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kTileRows = 8;

// c[r, 0:NV*16] = alpha * sum_q a(r, q) . b(q, 0:NV*16) (+ c when accumulate), for r < R: the
// pair a(r, q) is the word at a + 2 (r ars + q acs), b's row q of pairs starts at b + 2 q ldb.
template <int R, int NV>
inline __attribute__((always_inline)) void tile(int64_t k2, const uint16_t* a, int64_t ars, int64_t acs,
                                                const uint16_t* b, int64_t ldb, float* c, int64_t ldc, float alpha,
                                                bool accumulate) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < k2; ++q) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v)
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 2 * (q * ldb + v * kW)));
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + 2 * (r * ars + q * acs), 4);
      const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, bv[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kW;
      __m512 out = _mm512_mul_ps(acc[r][v], va);
      if (accumulate) out = _mm512_add_ps(out, _mm512_loadu_ps(cp));
      _mm512_storeu_ps(cp, out);
    }
}

template <int R>
void tile_row(int64_t n, int64_t k2, const uint16_t* a, int64_t ars, int64_t acs, const uint16_t* b, int64_t ldb,
              float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) tile<R, 2>(k2, a, ars, acs, b + 2 * j, ldb, c + j, ldc, alpha, accumulate);
  if (j < n) tile<R, 1>(k2, a, ars, acs, b + 2 * j, ldb, c + j, ldc, alpha, accumulate);
}

// C[m, n] (f32) = alpha * sum over k2 pairs of A(m) B(n) (+ C), n a multiple of 16: A's pairs read through word strides
// (ars, acs), so a transposed operand needs no copy; B pair rows of ldb words.
void small_gemm(int64_t m, int64_t n, int64_t k2, const uint16_t* a, int64_t ars, int64_t acs, const uint16_t* b,
                int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows)
    tile_row<kTileRows>(n, k2, a + 2 * i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, accumulate);
  // The last m - i < kTileRows rows: one instantiation per count.
  static constexpr decltype(&tile_row<1>) kRest[] = {tile_row<1>, tile_row<2>, tile_row<3>, tile_row<4>,
                                                      tile_row<5>, tile_row<6>, tile_row<7>};
  if (i < m) kRest[m - i - 1](n, k2, a + 2 * i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, accumulate);
}

struct RegisterTiles {
  static constexpr int64_t kTileRows = cpu::kTileRows;
  static void gemm(int64_t m, int64_t n, int64_t k2, const uint16_t* a, int64_t ars, int64_t acs, const uint16_t* b,
                   int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
    small_gemm(m, n, k2, a, ars, acs, b, ldb, c, ldc, alpha, accumulate);
  }
  struct Thread {};
};

}  // namespace

int64_t attention_workspace_avx512bf16(const AttentionDims& d, bool backward) {
  return backward ? backward_buffers(d, nullptr).size : forward_buffers(d, nullptr).size;
}

void attention_forward_avx512bf16(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out,
                                  float* lse, char* workspace) {
  forward_loops<RegisterTiles>(d, q, k, v, out, lse, workspace);
}

void attention_backward_avx512bf16(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                                   HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv,
                                   char* workspace) {
  backward_loops<RegisterTiles>(d, grad, q, k, v, out, lse, dq, dk, dv, workspace);
}

}  // namespace weft::kernels::cpu
