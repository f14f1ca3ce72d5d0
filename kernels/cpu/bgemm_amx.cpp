// kernels/cpu: the bf16 GEMM kernel for CPUs with AMX (bgemm.h), the tile unit of Intel's Sapphire Rapids and later.
// One tdpbf16ps multiplies a 16 x 32 tile of A (16 rows of 32 bf16 along k) by a 32 x 16 tile of B (16 rows of 16 bf16
// pairs: the layout the AVX512_BF16 kernel packs, bgemm_pack.h) into a 16 x 16 tile of f32 sums: 8,192 products per
// instruction, eight times vdpbf16ps's per cycle. The register tile is 2 x 2 such tiles (32 x 32 of c) in four of the
// eight tile registers; the other four hold two tiles of A and two of B. A is read in place when it is row-major and a
// depth block is whole tiles, else packed row-major (a column-major A, as in the weight gradient's dY^T, by 16 x 16
// transposes of bf16 pairs) with zeros to a multiple of 32 rows and depth; B is packed as the AVX512_BF16 kernel packs
// it (a B with contiguous depth, as W^T, by the same transposes), with zero pairs to a depth multiple of 32. Compiled
// with -mamx-tile -mamx-bf16 and called only where the CPU has AMX-BF16 and Linux has granted the process the tile
// state (gemm.cpp).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
// gcc 12 reports false "may be used uninitialized" warnings for the undefined pass-through
// operand inside its own AVX-512 widening and shift intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cstring>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/bgemm_pack.h"
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t T = 32;  // the register tile is T x T of c, and depth goes T at a time
// a's MC x KC block (512 KB) and b's KC x nc panel (up to 768 KB, at least NC_MIN columns)
// stay in L2 (2 MB a core where AMX is; docs/PERFORMANCE.md); an A micro-panel (T rows, up to
// 64 KB) is reused across b's panel while b streams from L2, c written a row segment at a time.
constexpr int64_t MC = 256, KC = 1024, NC_MIN = 256, B_BYTES = 768 << 10;

inline int64_t round_up(int64_t x) { return (x + T - 1) / T * T; }

// Rows [0, rows) (<= T) and depth [0, kc) of a row-wise a, a[i, p] at a[i * a_rs + p * a_cs],
// into out: T rows of kcp (kc rounded up to T) values, zeros past `rows` and past kc.
void pack_a(int64_t rows, int64_t kc, int64_t kcp, const uint16_t* a, int64_t a_rs, int64_t a_cs, uint16_t* out) {
  for (int64_t i = 0; i < T; ++i) {
    uint16_t* o = out + i * kcp;
    int64_t p = 0;
    if (i < rows && a_cs == 1) {
      std::memcpy(o, a + i * a_rs, size_t(kc) * 2);
      p = kc;
    } else if (i < rows) {
      for (; p < kc; ++p) o[p] = a[i * a_rs + p * a_cs];
    }
    std::memset(o + p, 0, size_t(kcp - p) * 2);
  }
}

// Rows [0, mc) of a column-major a (a[i, p] at a[i + p * a_cs]: the weight gradient's dY^T) as pack_a packs them, for
// all of the block's row panels at once (rows rounded up to T, the extra ones zero): pairs of depth rows, 16 rows of a
// at a time, transposed as 16 x 16 words. Depth goes outer, so each depth row of the block is read once, whole; panel
// by panel, every panel walked all kc depth rows, a row (a page, in a LoRA gradient's dY) apart per load.
void pack_a_columns(int64_t mc, int64_t kc, int64_t kcp, const uint16_t* a, int64_t a_cs, uint16_t* out) {
  const int64_t rows = round_up(mc);
  for (int64_t p0 = 0; p0 < kcp; p0 += T)
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      const int64_t lanes = mc - r0 >= 16 ? 16 : mc > r0 ? mc - r0 : 0;
      const __mmask16 m = __mmask16((1u << lanes) - 1);
      __m512i v[16];
      for (int64_t q = 0; q < 16; ++q) {
        const int64_t p = p0 + 2 * q;
        const __mmask16 m0 = p < kc ? m : 0, m1 = p + 1 < kc ? m : 0;
        const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, a + r0 + p * a_cs));
        const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, a + r0 + (p + 1) * a_cs));
        v[q] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      }
      transpose16x16(v);
      for (int64_t l = 0; l < 16; ++l) _mm512_storeu_si512(out + (r0 + l) * kcp + p0, v[l]);
    }
}

// c's T x T tile (f32, leading dim ldc) = a b, plus c's own values when `add`, over depth kcp
// (a multiple of T): a is T rows of bf16 a_ld apart, b a packed panel of kcp / 2 pair rows.
void tile_product(int64_t kcp, const uint16_t* a, int64_t a_ld, const uint16_t* b, float* c, int64_t ldc, bool add) {
  const int64_t a_bytes = a_ld * 2, c_bytes = ldc * 4;
  memory_barrier();
  if (add) {
    _tile_loadd(0, c, c_bytes);
    _tile_loadd(1, c + 16, c_bytes);
    _tile_loadd(2, c + 16 * ldc, c_bytes);
    _tile_loadd(3, c + 16 * ldc + 16, c_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t p = 0; p < kcp; p += T, b += T * T) {
    _tile_loadd(4, a + p, a_bytes);
    _tile_loadd(5, a + 16 * a_ld + p, a_bytes);
    _tile_loadd(6, b, 2 * T * 2);
    _tile_loadd(7, b + T, 2 * T * 2);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_bytes);
  _tile_stored(1, c + 16, c_bytes);
  _tile_stored(2, c + 16 * ldc, c_bytes);
  _tile_stored(3, c + 16 * ldc + 16, c_bytes);
  memory_barrier();
}

// The blocked product into f32 or bf16 c; with bf16 c, k must fit one KC block (no bias: see bgemm_amx).
void blocked(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
             int64_t b_rs, int64_t b_cs, void* c, bool c16, int64_t ldc, float alpha, float beta, const void*,
             double*) {
  static thread_local Scratch<uint16_t> a_buf, b_buf;
  static const TileConfig config;
  const int64_t kcp_max = round_up(std::min<int64_t>(k, KC));
  const int64_t NC = round_up(std::max(NC_MIN, B_BYTES / (2 * kcp_max)));
  uint16_t* pa = a_buf.get(MC * kcp_max);
  uint16_t* pb = b_buf.get(kcp_max * round_up(std::min<int64_t>(n, NC)));
  alignas(64) float edge[T * T];
  const int64_t es = c16 ? 2 : 4;
  _tile_loadconfig(&config);
  for (int64_t jc = 0; jc < n; jc += NC) {
    const int64_t nc = std::min<int64_t>(NC, n - jc);
    for (int64_t pc = 0; pc < k; pc += KC) {
      const int64_t kc = std::min<int64_t>(KC, k - pc), kcp = round_up(kc), kc2 = (kc + 1) / 2;
      const float beta_pc = pc == 0 ? beta : 1.0f;  // later k blocks accumulate onto the first
      pack_panels<T>(kc, nc, b + pc * b_rs + jc * b_cs, b_cs, b_rs, pb, T * kcp);
      for (int64_t j = 0; j < nc; j += T) std::memset(pb + j * kcp + kc2 * 2 * T, 0, size_t(kcp / 2 - kc2) * 2 * T * 2);
      const bool in_place = a_cs == 1 && kc % T == 0;  // whole T-row panels read from a itself
      for (int64_t ic = 0; ic < m; ic += MC) {
        const int64_t mc = std::min<int64_t>(MC, m - ic);
        if (a_rs == 1 && a_cs != 1)
          pack_a_columns(mc, kc, kcp, a + ic + pc * a_cs, a_cs, pa);
        else
          for (int64_t i = in_place ? mc / T * T : 0; i < mc; i += T)
            pack_a(std::min<int64_t>(T, mc - i), kc, kcp, a + (ic + i) * a_rs + pc * a_cs, a_rs, a_cs, pa + i * kcp);
        for (int64_t ir = 0; ir < mc; ir += T) {
          for (int64_t jr = 0; jr < nc; jr += T) {
            const int64_t mr = std::min<int64_t>(T, mc - ir), nr = std::min<int64_t>(T, nc - jr);
            const bool direct = in_place && mr == T;
            const uint16_t* ap = direct ? a + (ic + ir) * a_rs + pc : pa + ir * kcp;
            const int64_t a_ld = direct ? a_rs : kcp;
            const uint16_t* bp = pb + jr * kcp;
            char* cp = static_cast<char*>(c) + ((ic + ir) * ldc + jc + jr) * es;
            const bool full = mr == T && nr == T;
            float* cf = reinterpret_cast<float*>(cp);
            if (full && !c16 && alpha == 1.0f && (beta_pc == 0.0f || beta_pc == 1.0f)) {
              tile_product(kcp, ap, a_ld, bp, cf, ldc, beta_pc == 1.0f);
              continue;
            }
            // A tail tile adding onto c starts from c as a full one does, so that where a tile
            // falls in C (which depends on the split over threads) cannot change its sums.
            if (!c16 && alpha == 1.0f && beta_pc == 1.0f) {
              for (int64_t i = 0; i < T * T; ++i) edge[i] = i / T < mr && i % T < nr ? cf[i / T * ldc + i % T] : 0.0f;
              tile_product(kcp, ap, a_ld, bp, edge, T, true);
              for (int64_t i = 0; i < mr; ++i) std::copy_n(edge + i * T, nr, cf + i * ldc);
              continue;
            }
            tile_product(kcp, ap, a_ld, bp, edge, T, false);
            if (full) {
              const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta_pc);
              for (int64_t i = 0; i < T; ++i)
                for (int64_t v = 0; v < T; v += 16) {
                  char* cv = cp + (i * ldc + v) * es;
                  __m512 r = _mm512_mul_ps(va, _mm512_load_ps(edge + i * T + v));
                  if (beta_pc != 0.0f) r = _mm512_fmadd_ps(vb, load_c(cv, c16), r);
                  store_c(cv, c16, r);
                }
              continue;
            }
            store_tail(edge, T, mr, nr, cp, c16, ldc, alpha, beta_pc, nullptr);
          }
        }
      }
    }
  }
  _tile_release();
}

}  // namespace

void bgemm_amx(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t a_rs, int64_t a_cs, const uint16_t* b,
               int64_t b_rs, int64_t b_cs, void* c, bool c_bf16, int64_t ldc, float alpha, float beta,
               const void* bias, double*) {
  const int64_t es = c_bf16 ? 2 : 4;
  for (int64_t i = 0; bias && i < m; ++i) std::memcpy(static_cast<char*>(c) + i * ldc * es, bias, size_t(n * es));
  bgemm_by_depth_blocks(blocked, KC, m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, c_bf16, ldc, alpha,
                        bias ? 1.0f : beta, nullptr, nullptr);
}

}  // namespace weft::kernels::cpu
