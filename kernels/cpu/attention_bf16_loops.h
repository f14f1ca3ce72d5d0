// kernels/cpu: the loops of bf16 attention with f32 sums (attention_tiled.h), shared by the kernels that differ only in
// how they multiply: attention_avx512bf16.cpp (vdpbf16ps register tiles) and attention_amx.cpp (AMX tiles). The steps,
// grouped-query heads and rotary embeddings are those of attention_avx512.cpp, with every product on bf16 operands
// summed in f32: S = Q K^T, O = P V, dP = dO V^T, dQ = dS K, dV += P^T dO and dK += dS^T Q. The scores, softmax, lse, D
// and every sum (dK and dV over row blocks and query heads) stay f32; P and dS round to bf16 to enter the next product
// (the forward's P unnormalised, e^(s - max), each row of O divided by its sum after O = P V), rotated q and k round to
// bf16 once, and each output rounds once. TU-local (an anonymous namespace): each includer is
// built for its own instruction set.
//
// The products take bf16 operands with pairs of the summed index in one 32-bit word (a
// "pair" below), the layout both vdpbf16ps and the AMX tiles multiply:
//   row-major [T, C] bf16 holds pairs along C (the A side of S = Q K^T, O = P V, dQ = dS K);
//   a pair-row buffer [ceil(T/2), C] holds (x[2q, c], x[2q + 1, c]), pairs along T (the B
//   side of O = P V and dQ = dS K, and the transposed A and the B of the dV, dK updates);
//   a panel [C/2, ldk] holds (x[j, 2q], x[j, 2q + 1]) at word (q, j), keys along a row with
//   pairs along C (the B side of S = Q K^T and dP = dO V^T).
//
// A products policy P gives:
//   Products::kTileRows: query rows per product call (causal products stop near the diagonal);
//   Products::gemm(m, n, k2, a, ars, acs, b, ldb, c, ldc, alpha, accumulate): c[m, n] (f32) =
//     alpha * sum over k2 pairs of a(r, q) . b(q, :) (+ c), n a multiple of 16; the pair
//     a(r, q) is the word at a + 2 (r ars + q acs) (acs == 1, or ars == 1 for a transposed
//     operand), b's pair row q starts at b + 2 q ldb;
//   Thread: made once per thread around its products (state such as a tile configuration).
#pragma once
#include <cmath>
#include <cstring>

#include "kernels/cpu/attention_tiled_parts.h"  // and attention_tiled.h, avx512_math.h
#include "kernels/cpu/gemm_scratch.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kRowBlock = 32;  // query rows per block, as attention.cpp
constexpr int64_t kBackwardRowBlock = 64;  // dK and dV sum more depth per load and store of c

// The lanes of [x0[0..15], x1[0..15]] as (x0[0], x1[0], x0[1], x1[1], ...).
inline __m512i interleave16(__m512i both) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, both);
}

// Pair rows of a row-major bf16 [t, cols] buffer (cols a multiple of 16): out word (q, c) =
// (x[2q, c], x[2q + 1, c]), the partner of an odd t's last row 0.
void pair_rows(const uint16_t* x, int64_t t, int64_t cols, uint16_t* out) {
  const __m256i none = _mm256_setzero_si256();
  for (int64_t q = 0; 2 * q < t; ++q) {
    const uint16_t *r0 = x + 2 * q * cols, *r1 = r0 + cols;
    for (int64_t c = 0; c < cols; c += kW) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + c));
      const __m256i hi = 2 * q + 1 < t ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + c)) : none;
      _mm512_storeu_si512(out + 2 * (q * cols + c), interleave16(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)));
    }
  }
}

// Words (lo[c], hi[c]) for c < 16, each rounded to bf16, at p: one vector of a pair row.
inline void store_pairs(uint16_t* p, __m512 lo, __m512 hi) {
  _mm512_storeu_si512(p, interleave16(reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo))));
}

// One query row's softmax over the scaled scores s[0, valid), in two passes: the row's max, then e^(s - max) rounded
// into the bf16 row p[0, n16) that enters O = P V (zero from `valid` on) and summed in f32. P stays unnormalised: the
// row of O is divided by the sum (*inv_sum = 1 / sum) after the product. Returns the row's log-sum-exp.
inline float softmax_row_bf16(const float* s, int64_t valid, int64_t n16, uint16_t* p, float* inv_sum) {
  const float top = row_max(s, valid);
  const float total = exp_row(s, valid, n16, top, [p](int64_t j, __m512 e) { store_bf16x16(p + j, e); });
  *inv_sum = 1.f / total;
  return top + std::log(total);
}

// The panel of a row-major bf16 [t, cols] buffer: word (q, j) = word (j, q) of x for j < t, zero for t <= j < ld.
void panel(const uint16_t* x, int64_t t, int64_t cols, uint16_t* out, int64_t ld) {
  const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(int32_t(cols / 2)));
  for (int64_t q = 0; q < cols / 2; ++q) {
    uint16_t* o = out + 2 * q * ld;
    for (int64_t j = 0; j < ld; j += kW) {  // words (j .. j + 15, q) of x, zero from t on
      const __m512i at = _mm512_add_epi32(rows, _mm512_set1_epi32(int32_t(j * cols / 2)));
      _mm512_storeu_si512(o + 2 * j, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lanes_below(t, j), at, x + 2 * q, 4));
    }
  }
}

// A row's `bytes` into L1 ahead of its use: rows of another head's operand lie H rows apart, a stride the hardware
// prefetchers do not follow across pages.
inline void prefetch_row(const void* p, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(static_cast<const char*>(p) + b, _MM_HINT_T0);
}
constexpr int64_t kPrefetchRows = 8;

// The 16 values at p (bf16 bits or f32) as f32, lanes outside `live` zero.
template <typename S>
inline __m512 load_x16(const S* p, __mmask16 live) {
  if constexpr (sizeof(S) == 2)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p)), 16));
  else return _mm512_maskz_loadu_ps(live, p);
}
inline void store_bf16_lanes(uint16_t* p, __m512 v, __mmask16 live) {
  _mm256_mask_storeu_epi16(p, live, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// Rows [0, t) of src (row stride ss, bf16 or f32) into bf16 dst (row stride ds), each row rotated (kernels/rope.h) at
// positions pos0, pos0 + 1, ...: forward (sign 1) when packing q and k, inverse (sign -1) when writing the gradients of
// rotated operands. Without rotation a copy. Values round from f32 as the bf16 GEMM rounds them (vcvtneps2bf16).
template <typename S>
void rows_to_bf16(const AttentionDims& d, const S* src, int64_t ss, int64_t t, int64_t cols, int64_t pos0,
                  uint16_t* dst, int64_t ds, float sign) {
  const int64_t half = cols / 2;
  const __m512 vsign = _mm512_set1_ps(sign);
  for (int64_t j = 0; j < t; ++j) {
    const S* sr = src + j * ss;
    uint16_t* dr = dst + j * ds;
    if (j + kPrefetchRows < t) prefetch_row(sr + kPrefetchRows * ss, cols * int64_t(sizeof(S)));
    if (!d.rope_cos) {  // cols is a multiple of 16
      if constexpr (sizeof(S) == 2) std::memcpy(dr, sr, size_t(cols) * 2);
      else
        for (int64_t i = 0; i < cols; i += kW) store_bf16x16(dr + i, _mm512_loadu_ps(sr + i));
      continue;
    }
    const float *c = d.rope_cos + (pos0 + j) * half, *s = d.rope_sin + (pos0 + j) * half;
    for (int64_t i = 0; i < half; i += kW) {  // half is a multiple of 8
      const __mmask16 live = lanes_below(half, i);
      const __m512 a = load_x16(sr + i, live), b = load_x16(sr + half + i, live), ci = _mm512_maskz_loadu_ps(live, c + i);
      const __m512 si = _mm512_mul_ps(vsign, _mm512_maskz_loadu_ps(live, s + i));
      store_bf16_lanes(dr + i, _mm512_fmsub_ps(a, ci, _mm512_mul_ps(b, si)), live);
      store_bf16_lanes(dr + half + i, _mm512_fmadd_ps(b, ci, _mm512_mul_ps(a, si)), live);
    }
  }
}

// c = alpha * A B^T against a key panel for query rows [i0, i0 + m): A the rows' k2 pairs (row stride ars words), B the
// panel (ldb words a pair row), one row tile at a time so that causal tiles stop at the keys their last row sees
// (rounded up to a vector). Columns past a tile's are left as they were: the loops read only the keys each row sees.
template <class Products>
void panel_products(const uint16_t* a, int64_t ars, int64_t k2, const uint16_t* b, int64_t ldb, int64_t i0, int64_t m,
                    int64_t n, bool causal, float alpha, float* c, int64_t ldc) {
  for (int64_t r0 = 0; r0 < m; r0 += Products::kTileRows) {
    const int64_t rows = std::min<int64_t>(Products::kTileRows, m - r0);
    const int64_t nt = round_up(keys_seen(causal, i0, r0, rows, n), kW);
    Products::gemm(rows, nt, k2, a + 2 * r0 * ars, ars, 1, b, ldb, c + r0 * ldc, ldc, alpha, false);
  }
}

// One thread's buffers (Carve, attention_tiled_parts.h).
struct ForwardBuffers {
  float *S, *Oc;
  uint16_t *Pb, *Qc, *Kc, *KT, *Vc, *V2;
  int64_t size;
};
ForwardBuffers forward_buffers(const AttentionDims& d, char* base) {
  const int64_t rb = std::min<int64_t>(kRowBlock, d.Tq), ldk = key_ld(d.Tk), tk2 = round_up(d.Tk, 2);
  Carve c{base};
  ForwardBuffers f{};
  f.S = c.take<float>(rb * ldk), f.Oc = c.take<float>(d.Tq * d.Ev), f.Pb = c.take<uint16_t>(rb * ldk);
  f.Qc = c.take<uint16_t>(d.Tq * d.E), f.Kc = c.take<uint16_t>(d.Tk * d.E), f.KT = c.take<uint16_t>(d.E * ldk);
  f.Vc = c.take<uint16_t>(d.Tk * d.Ev), f.V2 = c.take<uint16_t>(tk2 * d.Ev);
  f.size = c.size;
  return f;
}
struct BackwardBuffers {
  float *P, *dP, *D, *dQc, *dKc, *dVc;
  uint16_t *P2, *dS2, *dSb, *KT, *VT, *K2, *Kc, *Vc, *Qc, *Q2, *Gc, *G2;
  int64_t size;
};
BackwardBuffers backward_buffers(const AttentionDims& d, char* base) {
  const int64_t rb = std::min<int64_t>(kBackwardRowBlock, d.Tq), ldk = key_ld(d.Tk), rb2 = round_up(rb, 2),
                tk2 = round_up(d.Tk, 2), tq2 = round_up(d.Tq, 2);
  Carve c{base};
  BackwardBuffers g{};
  g.P = c.take<float>(rb * ldk), g.dP = c.take<float>(rb * ldk), g.D = c.take<float>(d.Tq);
  g.dQc = c.take<float>(d.Tq * d.E), g.dKc = c.take<float>(d.Tk * d.E), g.dVc = c.take<float>(d.Tk * d.Ev);
  g.P2 = c.take<uint16_t>(rb2 * ldk), g.dS2 = c.take<uint16_t>(rb2 * ldk), g.dSb = c.take<uint16_t>(rb * ldk);
  g.KT = c.take<uint16_t>(d.E * ldk), g.VT = c.take<uint16_t>(d.Ev * ldk), g.K2 = c.take<uint16_t>(tk2 * d.E);
  g.Kc = c.take<uint16_t>(d.Tk * d.E), g.Vc = c.take<uint16_t>(d.Tk * d.Ev), g.Qc = c.take<uint16_t>(d.Tq * d.E);
  g.Q2 = c.take<uint16_t>(tq2 * d.E), g.Gc = c.take<uint16_t>(d.Tq * d.Ev), g.G2 = c.take<uint16_t>(tq2 * d.Ev);
  g.size = c.size;
  return g;
}

template <class Products>
void forward_loops(const AttentionDims& d, HeadsBF16 Q, HeadsBF16 K, HeadsBF16 V, HeadsBF16 O, float* L,
                   char* workspace) {
  const int64_t H = d.H, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const int64_t bh_count = d.B * H, ldk = key_ld(Tk), G = H / d.Hkv;
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = forward_buffers(d, nullptr).size;
    // Named pointers, not a structured binding, which clang 14 cannot capture into an OpenMP region.
    const ForwardBuffers buf = forward_buffers(d, workspace + thread_index() * size);
    float *const S = buf.S, *const Oc = buf.Oc;
    uint16_t *const Pb = buf.Pb, *const Qc = buf.Qc, *const Kc = buf.Kc, *const KT = buf.KT, *const Vc = buf.Vc;
    uint16_t* const V2 = buf.V2;
    [[maybe_unused]] const typename Products::Thread products;  // per-thread state (AMX: tile configuration)
    int64_t packed = -1;  // the (batch, key/value head) whose keys and values KT and V2 hold
    // A thread's tasks are consecutive (static schedule), so the G query heads of a key/value head reuse its packing.
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* lp = L + bh * Tq;
      rows_to_bf16(d, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc, E, 1.f);
      if (b * d.Hkv + h / G != packed) {
        packed = b * d.Hkv + h / G;
        rows_to_bf16(d, at(K, b, h / G), K.st, Tk, E, d.k_pos, Kc, E, 1.f);
        panel(Kc, Tk, E, KT, ldk);
        rows_to_bf16(AttentionDims{}, at(V, b, h / G), V.st, Tk, Ev, 0, Vc, Ev, 1.f);
        pair_rows(Vc, Tk, Ev, V2);
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min<int64_t>(kRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk, n16 = round_up(n, kW);
        panel_products<Products>(Qc + i0 * E, E / 2, E / 2, KT, ldk, i0, m, n, d.causal, d.scale, S, ldk);
        float inv_sum[kRowBlock];
        for (int64_t r = 0; r < m; ++r)
          lp[i0 + r] = softmax_row_bf16(S + r * ldk, d.causal ? i0 + r + 1 : n, n16, Pb + r * ldk, inv_sum + r);
        // O = P V, each row tile summing only over the key pairs it sees; then each row divided by its sum.
        for (int64_t r0 = 0; r0 < m; r0 += Products::kTileRows) {
          const int64_t rows = std::min<int64_t>(Products::kTileRows, m - r0), kn = keys_seen(d.causal, i0, r0, rows, n);
          Products::gemm(rows, Ev, (kn + 1) / 2, Pb + r0 * ldk, ldk / 2, 1, V2, Ev, Oc + (i0 + r0) * Ev, Ev, 1.f, false);
        }
        for (int64_t r = 0; r < m; ++r)
          for (float* o = Oc + (i0 + r) * Ev; o < Oc + (i0 + r + 1) * Ev; o += kW)
            _mm512_storeu_ps(o, _mm512_mul_ps(_mm512_loadu_ps(o), _mm512_set1_ps(inv_sum[r])));
      }
      rows_to_bf16(AttentionDims{}, Oc, Ev, Tq, Ev, 0, at(O, b, h), O.st, 1.f);
    }
  }
}

template <class Products>
void backward_loops(const AttentionDims& d, HeadsBF16 G, HeadsBF16 Q, HeadsBF16 K, HeadsBF16 V, HeadsBF16 O,
                    const float* L, HeadsBF16 DQ, HeadsBF16 DK, HeadsBF16 DV, char* workspace) {
  const int64_t H = d.H, Hkv = d.Hkv, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const int64_t task_count = d.B * Hkv, ldk = key_ld(Tk), group = H / Hkv;
  const AttentionDims plain{};  // copies without rotation
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = backward_buffers(d, nullptr).size;
    const BackwardBuffers buf = backward_buffers(d, workspace + thread_index() * size);
    float *const P = buf.P, *const dP = buf.dP, *const D = buf.D, *const dQc = buf.dQc, *const dKc = buf.dKc;
    float* const dVc = buf.dVc;
    uint16_t *const P2 = buf.P2, *const dS2 = buf.dS2, *const dSb = buf.dSb, *const KT = buf.KT, *const VT = buf.VT;
    uint16_t *const K2 = buf.K2, *const Kc = buf.Kc, *const Vc = buf.Vc, *const Qc = buf.Qc, *const Q2 = buf.Q2;
    uint16_t *const Gc = buf.Gc, *const G2 = buf.G2;
    [[maybe_unused]] const typename Products::Thread products;
    // One task per (batch, key/value head): its query heads run in turn and sum into dK, dV.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < task_count; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      rows_to_bf16(d, at(K, b, hk), K.st, Tk, E, d.k_pos, Kc, E, 1.f);
      rows_to_bf16(plain, at(V, b, hk), V.st, Tk, Ev, 0, Vc, Ev, 1.f);
      panel(Kc, Tk, E, KT, ldk);
      panel(Vc, Tk, Ev, VT, ldk);
      pair_rows(Kc, Tk, E, K2);
      std::fill_n(dKc, Tk * E, 0.f);
      std::fill_n(dVc, Tk * Ev, 0.f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const uint16_t* op = at(O, b, h);
        const float* lp = L + (b * H + h) * Tq;
        rows_to_bf16(d, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc, E, 1.f);
        rows_to_bf16(plain, at(G, b, h), G.st, Tq, Ev, 0, Gc, Ev, 1.f);
        pair_rows(Qc, Tq, E, Q2);
        pair_rows(Gc, Tq, Ev, G2);
        for (int64_t i = 0; i < Tq; ++i) {
          const uint16_t *g = Gc + i * Ev, *o = op + i * O.st;
          if (i + kPrefetchRows < Tq) prefetch_row(o + kPrefetchRows * O.st, 2 * Ev);
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < Ev; ++c) s += from_bf16(g[c]) * from_bf16(o[c]);
          D[i] = s;
        }
        for (int64_t i0 = 0; i0 < Tq; i0 += kBackwardRowBlock) {
          const int64_t m = std::min<int64_t>(kBackwardRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk;
          const int64_t n16 = round_up(n, kW);
          panel_products<Products>(Qc + i0 * E, E / 2, E / 2, KT, ldk, i0, m, n, d.causal, d.scale, P, ldk);
          // dP = dO V^T over the same columns.
          panel_products<Products>(Gc + i0 * Ev, Ev / 2, Ev / 2, VT, ldk, i0, m, n, d.causal, 1.f, dP, ldk);
          // P = exp(S - lse) and dS = P (dP - D) scale, by pairs of rows: rounded to bf16 as pair
          // rows (P2, dS2: the A side of dV, dK) and as rows (dSb: the A side of dQ). An odd m's
          // last row pairs with zeros; lanes from a row's `valid` on are zero.
          for (int64_t r = 0; r < m; r += 2) {
            __m512 l[2], di[2];
            int64_t valid[2];
            for (int h = 0; h < 2; ++h) {
              const int64_t i = std::min<int64_t>(i0 + r + h, Tq - 1);
              valid[h] = r + h >= m ? 0 : d.causal ? i0 + r + h + 1 : n;
              l[h] = _mm512_set1_ps(lp[i]), di[h] = _mm512_set1_ps(D[i]);
            }
            const __m512 sc = _mm512_set1_ps(d.scale);
            for (int64_t j = 0; j < n16; j += kW) {
              __m512 pv[2], ds[2];
              for (int h = 0; h < 2; ++h) {
                const __mmask16 live = lanes_below(valid[h], j);
                const int64_t at = (r + h) * ldk + j;
                pv[h] = ds[h] = _mm512_setzero_ps();
                if (live) {
                  pv[h] = _mm512_maskz_mov_ps(live, exp_x16(_mm512_sub_ps(_mm512_loadu_ps(P + at), l[h])));
                  ds[h] = _mm512_maskz_mul_ps(live, _mm512_mul_ps(pv[h], _mm512_sub_ps(_mm512_loadu_ps(dP + at), di[h])), sc);
                }
                if (r + h < m) store_bf16x16(dSb + at, ds[h]);
              }
              store_pairs(P2 + 2 * (r / 2 * ldk + j), pv[0], pv[1]);
              store_pairs(dS2 + 2 * (r / 2 * ldk + j), ds[0], ds[1]);
            }
          }
          // dV[0:n] += P^T dO and dK[0:n] += dS^T Q: the pair (P[2q, j], P[2q + 1, j]) is word
          // (q, j) of P2, so A = P^T reads P2 with strides (1, ldk); dO and Q as pair rows.
          const int64_t m2 = (m + 1) / 2;
          Products::gemm(n, Ev, m2, P2, 1, ldk, G2 + i0 * Ev, Ev, dVc, Ev, 1.f, true);
          Products::gemm(n, E, m2, dS2, 1, ldk, Q2 + i0 * E, E, dKc, E, 1.f, true);
          // dQ = dS K, each row tile summing only over the key pairs it sees.
          for (int64_t r0 = 0; r0 < m; r0 += Products::kTileRows) {
            const int64_t rows = std::min<int64_t>(Products::kTileRows, m - r0), kn = keys_seen(d.causal, i0, r0, rows, n);
            Products::gemm(rows, E, (kn + 1) / 2, dSb + r0 * ldk, ldk / 2, 1, K2, E, dQc + (i0 + r0) * E, E, 1.f, false);
          }
        }
        rows_to_bf16(d, dQc, E, Tq, E, d.q_pos, at(DQ, b, h), DQ.st, -1.f);
      }
      rows_to_bf16(d, dKc, E, Tk, E, d.k_pos, at(DK, b, hk), DK.st, -1.f);
      rows_to_bf16(plain, dVc, Ev, Tk, Ev, 0, at(DV, b, hk), DV.st, 1.f);
    }
  }
}

}  // namespace
}  // namespace weft::kernels::cpu
