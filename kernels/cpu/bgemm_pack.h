// kernels/cpu: what weft's bf16 GEMM kernels share (bgemm_avx512bf16.cpp, bgemm_amx.cpp): bf16 rounding, the packing of
// B into panels of bf16 pairs (the layout both vdpbf16ps and AMX's tdpbf16ps read), and loads and stores of an f32 or
// bf16 c. TU-local (an anonymous namespace), as gemm_scratch.h, since its includers are compiled for different ISAs;
// needs AVX512_BF16 (and BW, VL).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

// _mm512_permutex2var_epi16's index that pairs lane l of its first operand with lane l of its second: words
// (x0[0], x1[0], x0[1], x1[1], ...) of the first 16 lanes of each.
inline __m512i pair_lanes_index() {
  return _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35,
                          3, 34, 2, 33, 1, 32, 0);
}

// Interleaves the first `lanes` (<= 32) values of rows x0 and x1 into out[2 l] = x0[l],
// out[2 l + 1] = x1[l]; x1 null reads as zeros. Masked loads never touch beyond the lanes.
inline void interleave_pairs(const uint16_t* x0, const uint16_t* x1, int lanes, uint16_t* out) {
  const __m512i lo = pair_lanes_index();
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

// In place: row i of r[16] becomes column i (32-bit elements); packs bf16 pairs whose two
// values are adjacent (a 32-bit word) into panels and tile rows.
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c], 128-bit lane L: column 4L + c of rows i..i+3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), y = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i z = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee), w = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    t[c] = _mm512_shuffle_i32x4(x, y, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x, y, 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(z, w, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(z, w, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// One packed panel of W lanes (rows of A, or columns of B) for kc steps of k, in pairs: out[q * 2W + 2 l + h] = x[l *
// l_st + (2q + h) * k_st] for l < lanes, 2q + h < kc, else 0. Lanes contiguous (l_st 1) interleave two k rows at a
// time; pairs contiguous (k_st 1) transpose 32-bit words; any other layout goes element by element.
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
  // Pairs contiguous (a row-major operand read across its rows, as Linear's W^T): whole blocks of 16 pairs of 16 lanes
  // as a transpose of 32-bit words, the rest one pair at a time.
  int64_t q_done = 0;
  if (k_st == 1) {
    q_done = kc / 2 / 16 * 16;
    for (int64_t l0 = 0; l0 < lanes; l0 += 16) {
      const int nl = int(lanes - l0 < 16 ? lanes - l0 : 16);
      const __mmask16 keep = nl == 16 ? __mmask16(0xffff) : __mmask16((1u << nl) - 1);
      for (int64_t q0 = 0; q0 < q_done; q0 += 16) {
        __m512i r[16];
        for (int l = 0; l < 16; ++l)
          r[l] = l < nl ? _mm512_loadu_si512(x + (l0 + l) * l_st + 2 * q0) : _mm512_setzero_si512();
        transpose16x16(r);
        for (int q = 0; q < 16; ++q) _mm512_mask_storeu_epi32(out + (q0 + q) * 2 * W + 2 * l0, keep, r[q]);
      }
    }
  }
  for (int64_t l = 0; l < lanes; ++l) {
    const uint16_t* xl = x + l * l_st;
    uint16_t* o = out + 2 * l;
    if (k_st == 1) {
      for (int64_t q = q_done; q < kc / 2; ++q) std::memcpy(o + q * 2 * W, xl + 2 * q, 4);
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

// Lanes [0, lanes) of x as consecutive panels of W lanes, panel p at out + p * panel_stride, each as pack_pairs makes
// it. With contiguous lanes (l_st 1: a row-major B) each pair of depth rows is read once, whole, across all the panels
// (panel by panel, each load was on another page). The last panel's lanes past `lanes` are zeroed so that no
// uninitialised bits are read (they reach only outputs that are never stored).
template <int W>
void pack_panels(int64_t kc, int64_t lanes, const uint16_t* x, int64_t l_st, int64_t k_st, uint16_t* out,
                 int64_t panel_stride) {
  static_assert(32 % W == 0, "a panel is a whole part of interleave_pairs' 32 lanes");
  if (l_st != 1) {
    for (int64_t j = 0; j < lanes; j += W)
      pack_pairs<W>(kc, std::min<int64_t>(W, lanes - j), x + j * l_st, l_st, k_st, out + j / W * panel_stride);
    return;
  }
  const int64_t kc2 = (kc + 1) / 2;
  if (lanes % W) std::memset(out + lanes / W * panel_stride, 0, size_t(kc2) * 2 * W * sizeof(uint16_t));
  alignas(64) uint16_t row[64];
  for (int64_t q = 0; q < kc2; ++q) {
    const uint16_t* x0 = x + 2 * q * k_st;
    const uint16_t* x1 = 2 * q + 1 < kc ? x0 + k_st : nullptr;
    for (int64_t l0 = 0; l0 < lanes; l0 += 32) {
      const int n = int(lanes - l0 < 32 ? lanes - l0 : 32);
      uint16_t* o = W == 32 ? out + l0 / 32 * panel_stride + q * 64 : row;
      interleave_pairs(x0 + l0, x1 ? x1 + l0 : nullptr, n, o);
      for (int h = 0; W < 32 && h < n; h += W)
        std::memcpy(out + (l0 + h) / W * panel_stride + q * 2 * W, row + 2 * h, size_t(std::min(W, n - h)) * 4);
    }
  }
}

// Lanes [0, mc) (mc <= 160) of an operand with contiguous lanes (a column-major A: the weight gradient's dY^T) as the
// panels pack_pairs makes of W lanes each, panel p at out + p * W * 2 * kc2, the last one zero past mc: each pair of
// depth rows is read once, whole, and split among the panels, rather than read again for every panel (the same lines, W
// lanes at a time: 4.6 % of the GEMM's samples in GPT training's weight gradients). With sums (mc values), also sums[l]
// += lane l summed over the kc depth rows: in f32 over each 64 rows from x on (row 2q, then 2q + 1), each 64 rows'
// total added in f64.
template <int W>
void pack_pairs_lanes(int64_t kc, int64_t mc, const uint16_t* x, int64_t k_st, uint16_t* out, double* sums = nullptr) {
  const int64_t kc2 = (kc + 1) / 2;
  alignas(64) uint16_t row[2 * 160];
  alignas(64) float block[160];
  if (mc % W) std::memset(out + mc / W * W * 2 * kc2, 0, size_t(kc2) * 2 * W * sizeof(uint16_t));
  for (int64_t q = 0; q < kc2; ++q) {
    const uint16_t* x0 = x + 2 * q * k_st;
    // Rows a page or more apart are not prefetched by the hardware: each line 32 rows ahead into L1.
    for (int64_t l0 = 0; l0 < mc; l0 += 32)
      for (int64_t ahead : {32, 33}) _mm_prefetch(reinterpret_cast<const char*>(x0 + ahead * k_st + l0), _MM_HINT_T0);
    for (int64_t l0 = 0; sums && l0 < mc; l0 += 16) {  // bf16 to f32: the bits moved up 16
      const __mmask16 m = mc - l0 >= 16 ? __mmask16(0xffff) : __mmask16((1u << (mc - l0)) - 1);
      auto lanes = [&](const uint16_t* r) {
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, r)), 16));
      };
      const __m512 s = _mm512_add_ps(q % 32 ? _mm512_load_ps(block + l0) : _mm512_setzero_ps(), lanes(x0 + l0));
      _mm512_store_ps(block + l0, 2 * q + 1 < kc ? _mm512_add_ps(s, lanes(x0 + k_st + l0)) : s);
    }
    if (sums && (q % 32 == 31 || q == kc2 - 1))
      for (int64_t l = 0; l < mc; ++l) sums[l] += double(block[l]);
    for (int64_t l0 = 0; l0 < mc; l0 += 32)
      interleave_pairs(x0 + l0, 2 * q + 1 < kc ? x0 + k_st + l0 : nullptr, int(mc - l0 < 32 ? mc - l0 : 32),
                       row + 2 * l0);
    for (int64_t l0 = 0; l0 < mc; l0 += W) {
      uint16_t* o = out + l0 * 2 * kc2 + q * 2 * W;
      if (mc - l0 >= W) std::memcpy(o, row + 2 * l0, 2 * W * sizeof(uint16_t));
      else std::memcpy(o, row + 2 * l0, size_t(mc - l0) * 2 * sizeof(uint16_t));
    }
  }
}

inline __m512 load_c(const void* c, bool c16) {
  if (!c16) return _mm512_loadu_ps(static_cast<const float*>(c));
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(c)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
// Element j of a bias row of c's type (bgemm.h), as f32.
inline float bias_at(const void* bias, bool c16, int64_t j) {
  return c16 ? from_bf16(static_cast<const uint16_t*>(bias)[j]) : static_cast<const float*>(bias)[j];
}
inline void store_c(void* c, bool c16, __m512 v) {
  if (!c16) return _mm512_storeu_ps(static_cast<float*>(c), v);
  _mm256_storeu_si256(static_cast<__m256i*>(c), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// The valid mr x nr corner of a tail tile's sums (f32, leading dim edge_ld) into c at cp: alpha * sum + beta * c (+
// bias[j], the tile's part of the bias row), rounded once for a bf16 c.
inline void store_tail(const float* edge, int64_t edge_ld, int64_t mr, int64_t nr, char* cp, bool c16, int64_t ldc,
                       float alpha, float beta, const void* bias) {
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      uint16_t* o16 = reinterpret_cast<uint16_t*>(cp) + i * ldc + j;
      float* o = reinterpret_cast<float*>(cp) + i * ldc + j;
      float v = alpha * edge[i * edge_ld + j];
      if (beta != 0.0f) v = __builtin_fmaf(beta, c16 ? from_bf16(*o16) : *o, v);
      if (bias) v += bias_at(bias, c16, j);
      if (c16) *o16 = to_bf16(v);
      else *o = v;
    }
}

// Rows [0, rows) of f32 sums (leading dim n) into a bf16 c: sum + beta * c + bias, rounded once.
inline void round_rows_into(const float* sum, int64_t rows, int64_t n, uint16_t* c16, int64_t ldc, float beta,
                            const void* bias) {
  const int64_t n16 = n / 16 * 16;
  const uint16_t* b16 = static_cast<const uint16_t*>(bias);
#pragma omp parallel for if (rows * n > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < n16; j += 16) {
      __m512 v = _mm512_loadu_ps(sum + i * n + j);
      if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_set1_ps(beta), load_c(c16 + i * ldc + j, true), v);
      store_c(c16 + i * ldc + j, true, bias ? _mm512_add_ps(v, load_c(b16 + j, true)) : v);
    }
    if (n16 < n)
      store_tail(sum + i * n + n16, n, 1, n - n16, reinterpret_cast<char*>(c16 + i * ldc + n16), true, ldc, 1.0f,
                 beta, bias ? b16 + n16 : nullptr);
  }
}

// c = alpha a b + beta c + bias (the arguments of bgemm.h) by `blocked`, a kernel's blocked product into an f32 or bf16
// c that takes a bf16 c only within one depth block of `kc` (later blocks would add through bf16): a bf16 result over
// several blocks is summed in f32, rounded once, in blocks whose f32 sums fit bgemm_sum_block (one buffer per thread,
// kept): blocks of columns when c is wider than tall (a, the smaller operand, packed again for each), else of rows (b
// packed again). By rows, a 128,256-token head at 512 rows packed its 525 MB weight 16 times.
template <class Blocked>
void bgemm_by_depth_blocks(Blocked blocked, int64_t kc, int64_t m, int64_t n, int64_t k, const uint16_t* a,
                           int64_t a_rs, int64_t a_cs, const uint16_t* b, int64_t b_rs, int64_t b_cs, void* c,
                           bool c_bf16, int64_t ldc, float alpha, float beta, const void* bias, double* a_sums) {
  if (!c_bf16 || k <= kc)
    return blocked(m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, c_bf16, ldc, alpha, beta, bias, a_sums);
  static thread_local Scratch<float> scratch;
  const bool by_cols = n > m;
  const int64_t len = by_cols ? n : m, across = by_cols ? m : n;
  const int64_t step = std::min(len, std::max<int64_t>(32, bgemm_sum_block.load() / across / 32 * 32));
  float* sum = scratch.get(step * across);
  for (int64_t p0 = 0; p0 < len; p0 += step) {
    const int64_t i0 = by_cols ? 0 : p0, j0 = by_cols ? p0 : 0;
    const int64_t mr = by_cols ? m : std::min(step, m - p0), nc = by_cols ? std::min(step, n - p0) : n;
    blocked(mr, nc, k, a + i0 * a_rs, a_rs, a_cs, b + j0 * b_cs, b_rs, b_cs, sum, false, nc, alpha, 0.0f, nullptr,
            a_sums && j0 == 0 ? a_sums + i0 : nullptr);  // a_sums are added to: taken in the first column block
    round_rows_into(sum, mr, nc, static_cast<uint16_t*>(c) + i0 * ldc + j0, ldc, beta,
                    bias ? static_cast<const uint16_t*>(bias) + j0 : nullptr);
  }
}

}  // namespace
}  // namespace weft::kernels::cpu
