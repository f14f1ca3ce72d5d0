// kernels/cpu: f32 attention with register tiles, for head dims that are multiples of 16, on f32 operands or (on CPUs
// without a bf16 kernel) bf16 ones computed in f32. Compiled with -mavx512f in its own static library and called only
// when the CPU has AVX-512 (attention.cpp); like the GEMM kernels it includes nothing with out-of-line code built for
// another instruction set (no std:: containers or algorithms).
//
// Eigen's GEMM packs both operands on every call, which costs as much as the arithmetic at these sizes. Here keys and
// values are transposed into [C, Tk] panels once per (batch, key/value head) (16 x 16 blocks in registers), the other
// operands are read in place, and every product is a sweep of 6 x 64 output tiles held in 24 vector registers, summed
// in chunks of 64 so that a chunk of the streamed operand stays in L1 across the row tiles of a block. Row tiles of 6
// also follow the causal diagonal: a tile's scores stop at the first multiple of 16 past its last row, and its
// weighted sums at its last row's keys. The steps, grouped-query heads and rotary embeddings are those of
// attention.cpp's generic loops; rotated (and bf16) operands are copied into f32 buffers first, rotated (widened) as
// they are copied, and results written through buffers are rotated back (rounded) as they are copied out.
#include <type_traits>

#include "kernels/cpu/attention_tiled_parts.h"  // and attention_tiled.h, avx512_math.h
#include "kernels/cpu/gemm_scratch.h"
// gcc 12 reports a false "used uninitialized" for the undefined pass-through operand inside its own AVX-512 unpack
// intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kRowBlock = 36;  // query rows per block: 6 row tiles

void zero(float* begin, float* end) {
  for (float* p = begin; p < end; ++p) *p = 0.f;
}

constexpr int64_t kTileRows = 6;    // rows of a register tile: 6 x 64 holds 24 accumulators
constexpr int64_t kMaxVectors = 4;  // vectors across a tile

// c[r, 0:NV*16] = alpha * sum_p a[r*ars + p*acs] * b[p*ldb + 0:NV*16] (+ c when accumulate), for r < R.
template <int R, int NV>
void tile(int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c, int64_t ldc,
          float alpha, bool accumulate) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_loadu_ps(b + p * ldb + v * kW);
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * ars + p * acs]);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kW;
      const __m512 out = _mm512_mul_ps(acc[r][v], _mm512_set1_ps(alpha));
      _mm512_storeu_ps(cp, accumulate ? _mm512_add_ps(out, _mm512_loadu_ps(cp)) : out);
    }
}

// The register tiles of up to kTileRows x (16 kMaxVectors): tile_fn(rows, vectors).
using TileFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, float, bool);
template <int R>
struct TilesOf {
  static constexpr TileFn fn[kMaxVectors] = {tile<R, 1>, tile<R, 2>, tile<R, 3>, tile<R, 4>};
};
TileFn tile_fn(int64_t rows, int64_t vectors) {
  static constexpr const TileFn* kRows[kTileRows] = {TilesOf<1>::fn, TilesOf<2>::fn, TilesOf<3>::fn,
                                                     TilesOf<4>::fn, TilesOf<5>::fn, TilesOf<6>::fn};
  return kRows[rows - 1][vectors - 1];
}

// C[m, n] = alpha * A[m, k] B[k, n] (+ C), n a multiple of 16, where the row tile at row i sums over the first
// k_of(i, rows) values of the summed index only (the keys a causal row tile sees; at most k). A is read through strides
// (ars, acs) so that a transposed operand needs no copy; B is row-major. The sum goes in chunks of kChunk, and within a
// chunk column strips of 64 go outside and row tiles inside: a chunk's strip of B (16 KiB) stays in L1 while every row
// tile reads it.
constexpr int64_t kChunk = 64;
template <typename KOf>
void small_gemm(int64_t m, int64_t n, int64_t k, KOf k_of, const float* a, int64_t ars, int64_t acs, const float* b,
                int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  for (int64_t k0 = 0; k0 < k; k0 += kChunk)
    for (int64_t j = 0; j < n; j += kMaxVectors * kW) {
      const int64_t vectors = std::min<int64_t>(kMaxVectors, (n - j) / kW);
      for (int64_t i = 0; i < m; i += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, m - i), kt = std::min<int64_t>(k0 + kChunk, k_of(i, rows));
        if (k0 < kt)
          tile_fn(rows, vectors)(kt - k0, a + i * ars + k0 * acs, ars, acs, b + k0 * ldb + j, ldb, c + i * ldc + j,
                                 ldc, alpha, accumulate || k0 > 0);
      }
    }
}
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b,
                int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  small_gemm(m, n, k, [k](int64_t, int64_t) { return k; }, a, ars, acs, b, ldb, c, ldc, alpha, accumulate);
}

// The 16 x 16 block at x (rows ldx apart) transposed into y (rows ldy apart); rows of x past `rows` read as zero.
void transpose16(const float* x, int64_t ldx, int64_t rows, float* y, int64_t ldy) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(x + i * ldx) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2)  // per 128-bit lane: rows i and i + 1 interleaved by 32 bits
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4)  // then by 64: lane l of r[i + c] is column 4 l + c of rows i..i+3
    for (int h = 0; h < 2; ++h) {
      const __m512d lo = _mm512_castps_pd(t[i + h]), hi = _mm512_castps_pd(t[i + h + 2]);
      r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, hi));
      r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, hi));
    }
  for (int c = 0; c < 4; ++c) {  // column 4 l + c: lane l of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512 v01 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), w01 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    const __m512 v23 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xee), w23 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xee);
    _mm512_storeu_ps(y + c * ldy, _mm512_shuffle_f32x4(v01, w01, 0x88));
    _mm512_storeu_ps(y + (c + 4) * ldy, _mm512_shuffle_f32x4(v01, w01, 0xdd));
    _mm512_storeu_ps(y + (c + 8) * ldy, _mm512_shuffle_f32x4(v23, w23, 0x88));
    _mm512_storeu_ps(y + (c + 12) * ldy, _mm512_shuffle_f32x4(v23, w23, 0xdd));
  }
}

// panel[c, j] = x[j, c] for j < t, zero for t <= j < ld: keys or values as a [C, ld] panel (cols a multiple of 16, ld
// at least t rounded up to 16). x is a packed [t, cols] copy, transposed in 16 x 16 blocks in registers.
void transpose_panel(const float* x, int64_t ldx, int64_t t, int64_t cols, float* panel, int64_t ld) {
  for (int64_t j = 0; j < t; j += kW)
    for (int64_t c = 0; c < cols; c += kW)
      transpose16(x + j * ldx + c, ldx, std::min<int64_t>(kW, t - j), panel + c * ld + j, ld);
  for (int64_t c = 0; c < cols; ++c) zero(panel + c * ld + round_up(t, kW), panel + (c + 1) * ld);
}

// Scores of query rows [i0, i0 + m) against the block's n keys: S = scale * Q K^T (row stride lds), one row tile at a
// time so that causal tiles stop at the keys their last row sees, rounded up to a vector; columns past a tile's are
// zeroed up to n rounded up.
void scores(const float* qp, int64_t qst, int64_t E, const float* kt, int64_t ldk, int64_t i0, int64_t m, int64_t n,
            bool causal, float scale, float* S, int64_t lds) {
  const int64_t n16 = round_up(n, kW);
  auto columns = [&](int64_t r0) {  // of the row tile at r0
    return round_up(keys_seen(causal, i0, r0, std::min<int64_t>(kTileRows, m - r0), n), kW);
  };
  for (int64_t j = 0; j < n16; j += kMaxVectors * kW)  // strips of K^T outside, as small_gemm
    for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
      const int64_t rows = std::min<int64_t>(kTileRows, m - r0), nt = columns(r0);
      if (j < nt)
        tile_fn(rows, std::min<int64_t>(kMaxVectors, (nt - j) / kW))(E, qp + (i0 + r0) * qst, qst, 1, kt + j, ldk,
                                                                     S + r0 * lds + j, lds, scale, false);
    }
  for (int64_t r = 0; r < m; ++r) zero(S + r * lds + columns(r / kTileRows * kTileRows), S + r * lds + n16);
}

// One query row's softmax over its scaled scores s[0, valid), in place, zero on to n16 (a multiple of 16); returns the
// row's log-sum-exp.
float softmax_row(float* s, int64_t valid, int64_t n16) {
  const float top = row_max(s, valid);
  const float total = exp_row(s, valid, n16, top, [s](int64_t j, __m512 e) { _mm512_storeu_ps(s + j, e); });
  const __m512 inv = _mm512_set1_ps(1.f / total);
  for (int64_t j = 0; j < valid; j += kW) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
  return top + std::log(total);
}

// The backward's row of P = exp(S - lse) and dS = P (dP - D) scale over the scaled scores p[0, valid) and dP's row,
// in place, both zero on to n16.
void softmax_grad_row(float* p, float* dp, int64_t valid, int64_t n16, float lse, float D, float scale) {
  const __m512 l = _mm512_set1_ps(lse), di = _mm512_set1_ps(D), sc = _mm512_set1_ps(scale);
  for (int64_t j = 0; j < n16; j += kW) {
    const __m512 e = _mm512_maskz_mov_ps(lanes_below(valid, j), exp_x16(_mm512_sub_ps(_mm512_loadu_ps(p + j), l)));
    _mm512_storeu_ps(p + j, e);
    _mm512_storeu_ps(dp + j, _mm512_mul_ps(_mm512_mul_ps(e, _mm512_sub_ps(_mm512_loadu_ps(dp + j), di)), sc));
  }
}

// A value as f32 (bf16 bits widened), and an f32 result stored as the operand's type (bf16 rounded to nearest even).
inline float widen(float x) { return x; }
inline float widen(uint16_t x) { return from_bf16(x); }
inline void store_as(float v, float* p) { *p = v; }
inline void store_as(float v, uint16_t* p) { *p = to_bf16(v); }

// Rows [0, t) of src (row stride ss) into dst (row stride ds), converted between f32 and the operand's type; with
// `rotate` and rotary tables each row is rotated (kernels/rope.h) at positions pos0, pos0 + 1, ...: forward (sign 1)
// for q and k, inverse (sign -1) for the gradients of rotated operands. The operands' rows are pages apart (the heads
// of a fused projection), where the hardware's prefetch stops: each row asks for the one kAhead further on.
constexpr int64_t kAhead = 8;
template <typename Src, typename Dst>
void copy_rows(const AttentionDims& d, bool rotate, const Src* src, int64_t ss, int64_t t, int64_t cols, int64_t pos0,
               Dst* dst, int64_t ds, float sign) {
  const int64_t half = cols / 2;
  for (int64_t j = 0; j < t; ++j) {
    const Src* sr = src + j * ss;
    Dst* dr = dst + j * ds;
    for (int64_t c = 0; c < cols && j + kAhead < t; c += kW) {
      __builtin_prefetch(sr + kAhead * ss + c);
      __builtin_prefetch(dr + kAhead * ds + c, 1);
    }
    if (!(rotate && d.rope_cos)) {
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) store_as(widen(sr[c]), dr + c);
      continue;
    }
    const float *c = d.rope_cos + (pos0 + j) * half, *s = d.rope_sin + (pos0 + j) * half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = widen(sr[i]), b = widen(sr[i + half]), si = sign * s[i];
      store_as(a * c[i] - b * si, dr + i);
      store_as(b * c[i] + a * si, dr + i + half);
    }
  }
}

// A head's rows in f32 for the products: read in place where stored as f32 and not rotated, else widened (and
// rotated) into `buf`, cols apart.
struct Rows {
  float* p;
  int64_t st;
};
template <typename S>
Rows f32_rows(const AttentionDims& d, bool rotate, S* src, int64_t ss, int64_t t, int64_t cols, int64_t pos0,
              float* buf) {
  if constexpr (std::is_same_v<S, float>)
    if (!(rotate && d.rope_cos)) return {src, ss};
  copy_rows(d, rotate, src, ss, t, cols, pos0, buf, cols, 1.f);
  return {buf, cols};
}
// Where a head's f32 results go: in place where stored as f32 and not rotated back, else into `buf`, from where
// put_rows converts (and rotates) them into the head.
template <typename S>
Rows f32_out(const AttentionDims& d, bool rotated, S* dst, int64_t ds, int64_t cols, float* buf) {
  if constexpr (std::is_same_v<S, float>)
    if (!(rotated && d.rope_cos)) return {dst, ds};
  return {buf, cols};
}
template <typename S>
void put_rows(const AttentionDims& d, bool rotated, Rows r, int64_t t, int64_t cols, int64_t pos0, S* dst,
              int64_t ds) {
  if (static_cast<void*>(r.p) != static_cast<void*>(dst)) copy_rows(d, rotated, r.p, r.st, t, cols, pos0, dst, ds, -1.f);
}
void zero_rows(Rows r, int64_t t, int64_t cols) {
  for (int64_t j = 0; j < t; ++j) zero(r.p + j * r.st, r.p + j * r.st + cols);
}

// One thread's buffers (Carve, attention_tiled_parts.h): the copies of q, k and the gradients of rotated operands only
// where there is a rotation or the heads are bf16, those of v, the output and dO only for bf16 heads.
struct ForwardBuffers {
  float *S, *KT, *Qc, *Kc, *Vc, *Oc;
  int64_t size;
};
ForwardBuffers forward_buffers(const AttentionDims& d, bool widened, char* base) {
  const int64_t rb = std::min<int64_t>(kRowBlock, d.Tq), ldk = key_ld(d.Tk);
  const int64_t rot = d.rope_cos || widened, wide = widened;  // 1 where those copies are needed, else 0
  Carve c{base};
  ForwardBuffers f{};
  f.S = c.take<float>(rb * ldk), f.KT = c.take<float>(d.E * ldk), f.Qc = c.take<float>(rot * d.Tq * d.E);
  f.Kc = c.take<float>(rot * d.Tk * d.E), f.Vc = c.take<float>(wide * d.Tk * d.Ev), f.Oc = c.take<float>(wide * d.Tq * d.Ev);
  f.size = c.size;
  return f;
}
struct BackwardBuffers {
  float *P, *dP, *KT, *VT, *D, *Qc, *dQc, *Gc, *Kc, *dKc, *dVc, *Vc;
  int64_t size;
};
BackwardBuffers backward_buffers(const AttentionDims& d, bool widened, char* base) {
  const int64_t rb = std::min<int64_t>(kRowBlock, d.Tq), ldk = key_ld(d.Tk);
  const int64_t rot = d.rope_cos || widened, wide = widened;  // 1 where those copies are needed, else 0
  Carve c{base};
  BackwardBuffers g{};
  g.P = c.take<float>(rb * ldk), g.dP = c.take<float>(rb * ldk), g.KT = c.take<float>(d.E * ldk);
  g.VT = c.take<float>(d.Ev * ldk), g.D = c.take<float>(d.Tq), g.Qc = c.take<float>(rot * d.Tq * d.E);
  g.dQc = c.take<float>(rot * d.Tq * d.E), g.Kc = c.take<float>(rot * d.Tk * d.E), g.dKc = c.take<float>(rot * d.Tk * d.E);
  g.Gc = c.take<float>(wide * d.Tq * d.Ev), g.dVc = c.take<float>(wide * d.Tk * d.Ev), g.Vc = c.take<float>(wide * d.Tk * d.Ev);
  g.size = c.size;
  return g;
}

// Each (batch, head) reads its f32 operands in place (keys transposed once per key/value head into a panel that stays
// in the core's L2 for all the products that follow); rotated or 16-bit ones are first copied into f32 buffers.
template <typename Hd>
void forward(const AttentionDims& d, Hd Q, Hd K, Hd V, Hd O, float* L, char* workspace) {
  constexpr bool widened = std::is_same_v<Hd, HeadsBF16>;
  const int64_t B = d.B, H = d.H, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const int64_t bh_count = B * H, ldk = key_ld(Tk), G = H / d.Hkv;
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = forward_buffers(d, widened, nullptr).size;
    // Named pointers, not a structured binding, which clang 14 cannot capture into an OpenMP region.
    const ForwardBuffers buf = forward_buffers(d, widened, workspace + thread_index() * size);
    float *const S = buf.S, *const KT = buf.KT, *const Qc = buf.Qc, *const Kc = buf.Kc, *const Vc = buf.Vc;
    float* const Oc = buf.Oc;
    int64_t packed = -1;  // the (batch, key/value head) in KT and v: a thread's heads are consecutive
    Rows v{};
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* lp = L + bh * Tq;
      const Rows q = f32_rows(d, true, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc);
      if (b * d.Hkv + h / G != packed) {
        packed = b * d.Hkv + h / G;
        const Rows k = f32_rows(d, true, at(K, b, h / G), K.st, Tk, E, d.k_pos, Kc);
        transpose_panel(k.p, k.st, Tk, E, KT, ldk);
        v = f32_rows(d, false, at(V, b, h / G), V.st, Tk, Ev, 0, Vc);
      }
      const Rows o = f32_out(d, false, at(O, b, h), O.st, Ev, Oc);
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min<int64_t>(kRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk, n16 = round_up(n, kW);
        scores(q.p, q.st, E, KT, ldk, i0, m, n, d.causal, d.scale, S, ldk);
        for (int64_t r = 0; r < m; ++r) lp[i0 + r] = softmax_row(S + r * ldk, d.causal ? i0 + r + 1 : n, n16);
        // O = P V, each row tile summing only over the keys it sees.
        auto keys = [&](int64_t r0, int64_t rows) { return keys_seen(d.causal, i0, r0, rows, n); };
        small_gemm(m, Ev, n, keys, S, ldk, 1, v.p, v.st, o.p + i0 * o.st, o.st, 1.f, false);
      }
      put_rows(d, false, o, Tq, Ev, 0, at(O, b, h), O.st);
    }
  }
}

// D_i = dO_i . O_i for the query rows of one head: the row sums of dP * P that the softmax backward subtracts, summed
// in one order whatever o's type (so that bf16 operands give the bits of f32 ones).
inline __m512 load_f32x16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load_f32x16(const uint16_t* p) { return load_bf16x16(p); }
template <typename S>
void row_dots(Rows g, const S* o, int64_t ost, int64_t Tq, int64_t Ev, float* D) {
  for (int64_t i = 0; i < Tq; ++i) {
    const float* gi = g.p + i * g.st;
    const S* oi = o + i * ost;
    for (int64_t c = 0; c < Ev && i + kAhead < Tq; c += kW) __builtin_prefetch(oi + kAhead * ost + c);  // pages apart
    __m512 s = _mm512_setzero_ps();
    for (int64_t c = 0; c < Ev; c += kW) s = _mm512_fmadd_ps(_mm512_loadu_ps(gi + c), load_f32x16(oi + c), s);
    D[i] = _mm512_reduce_add_ps(s);
  }
}

template <typename Hd>
void backward(const AttentionDims& d, Hd G, Hd Q, Hd K, Hd V, Hd O, const float* L, Hd DQ, Hd DK, Hd DV,
              char* workspace) {
  constexpr bool widened = std::is_same_v<Hd, HeadsBF16>;
  const int64_t B = d.B, H = d.H, Hkv = d.Hkv, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const float scale = d.scale;  // in a register through the loops that store floats
  const int64_t task_count = B * Hkv, ldk = key_ld(Tk), group = H / Hkv;
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = backward_buffers(d, widened, nullptr).size;
    const BackwardBuffers buf = backward_buffers(d, widened, workspace + thread_index() * size);
    float *const P = buf.P, *const dP = buf.dP, *const KT = buf.KT, *const VT = buf.VT, *const D = buf.D;
    float *const Qc = buf.Qc, *const dQc = buf.dQc, *const Gc = buf.Gc, *const Kc = buf.Kc, *const dKc = buf.dKc;
    float *const dVc = buf.dVc, *const Vc = buf.Vc;
    // One task per (batch, key/value head): its query heads run in turn and sum into dK, dV.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < task_count; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      const Rows k = f32_rows(d, true, at(K, b, hk), K.st, Tk, E, d.k_pos, Kc);
      const Rows v = f32_rows(d, false, at(V, b, hk), V.st, Tk, Ev, 0, Vc);
      transpose_panel(k.p, k.st, Tk, E, KT, ldk);
      transpose_panel(v.p, v.st, Tk, Ev, VT, ldk);
      const Rows dk = f32_out(d, true, at(DK, b, hk), DK.st, E, dKc), dv = f32_out(d, false, at(DV, b, hk), DV.st, Ev, dVc);
      zero_rows(dk, Tk, E);
      zero_rows(dv, Tk, Ev);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const float* lp = L + (b * H + h) * Tq;
        const Rows q = f32_rows(d, true, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc);
        const Rows g = f32_rows(d, false, at(G, b, h), G.st, Tq, Ev, 0, Gc);
        const Rows dq = f32_out(d, true, at(DQ, b, h), DQ.st, E, dQc);
        row_dots(g, at(O, b, h), O.st, Tq, Ev, D);
        for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
          const int64_t m = std::min<int64_t>(kRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk, n16 = round_up(n, kW);
          scores(q.p, q.st, E, KT, ldk, i0, m, n, d.causal, d.scale, P, ldk);
          scores(g.p, g.st, Ev, VT, ldk, i0, m, n, d.causal, 1.f, dP, ldk);  // dP = dO V^T over the same columns
          for (int64_t r = 0; r < m; ++r)
            softmax_grad_row(P + r * ldk, dP + r * ldk, d.causal ? i0 + r + 1 : n, n16, lp[i0 + r], D[i0 + r], scale);
          // dV[0:n] += P^T dO, dK[0:n] += dS^T Q: P^T and dS^T are P and dS read with swapped strides.
          small_gemm(n, Ev, m, P, 1, ldk, g.p + i0 * g.st, g.st, dv.p, dv.st, 1.f, true);
          small_gemm(n, E, m, dP, 1, ldk, q.p + i0 * q.st, q.st, dk.p, dk.st, 1.f, true);
          // dQ = dS K, each row tile summing only over the keys it sees.
          auto keys = [&](int64_t r0, int64_t rows) { return keys_seen(d.causal, i0, r0, rows, n); };
          small_gemm(m, E, n, keys, dP, ldk, 1, k.p, k.st, dq.p + i0 * dq.st, dq.st, 1.f, false);
        }
        put_rows(d, true, dq, Tq, E, d.q_pos, at(DQ, b, h), DQ.st);
      }
      put_rows(d, true, dk, Tk, E, d.k_pos, at(DK, b, hk), DK.st);
      put_rows(d, false, dv, Tk, Ev, 0, at(DV, b, hk), DV.st);
    }
  }
}

}  // namespace

int64_t attention_workspace_avx512(const AttentionDims& d, bool backward, bool bf16) {
  return backward ? backward_buffers(d, bf16, nullptr).size : forward_buffers(d, bf16, nullptr).size;
}

void attention_forward_avx512(const AttentionDims& d, HeadsF32 q, HeadsF32 k, HeadsF32 v, HeadsF32 out, float* lse,
                              char* workspace) {
  forward(d, q, k, v, out, lse, workspace);
}
void attention_forward_avx512(const AttentionDims& d, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v, HeadsBF16 out,
                              float* lse, char* workspace) {
  forward(d, q, k, v, out, lse, workspace);
}
void attention_backward_avx512(const AttentionDims& d, HeadsF32 grad, HeadsF32 q, HeadsF32 k, HeadsF32 v,
                               HeadsF32 out, const float* lse, HeadsF32 dq, HeadsF32 dk, HeadsF32 dv, char* workspace) {
  backward(d, grad, q, k, v, out, lse, dq, dk, dv, workspace);
}
void attention_backward_avx512(const AttentionDims& d, HeadsBF16 grad, HeadsBF16 q, HeadsBF16 k, HeadsBF16 v,
                               HeadsBF16 out, const float* lse, HeadsBF16 dq, HeadsBF16 dk, HeadsBF16 dv,
                               char* workspace) {
  backward(d, grad, q, k, v, out, lse, dq, dk, dv, workspace);
}

}  // namespace weft::kernels::cpu
