// kernels/cpu: f32 attention with register tiles, for head dims that are multiples of 16. Compiled with -mavx512f in
// its own static library and called only when the CPU has AVX-512 (attention.cpp); like the GEMM kernels it includes
// nothing with out-of-line code built for another instruction set (no std:: containers or algorithms).
//
// Eigen's GEMM packs both operands on every call, which costs as much as the arithmetic at these sizes. Here keys and
// values are transposed into [C, Tk] panels once per (batch, key/value head), and every product is a sweep of 8 x 32
// output tiles held in 16 vector registers. Row tiles of 8 also follow the causal diagonal more closely than 32-row
// blocks: a tile's scores stop at the first multiple of 16 past its last row. The steps, grouped-query heads and rotary
// embeddings are those of attention.cpp's generic loops; the rotation happens in the copies into the packed buffers.
#include <algorithm>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/attention_tiled.h"
#include "kernels/cpu/softmax_row.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kRowBlock = 32;  // query rows per block, as attention.cpp

void zero(float* begin, float* end) {
  for (float* p = begin; p < end; ++p) *p = 0.f;
}
float* at(const HeadsF32& x, int64_t b, int64_t h) { return x.p + b * x.sb + h * x.sh; }
int64_t thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

using vf = float __attribute__((vector_size(64)));
constexpr int64_t kW = 16;  // floats per vector
constexpr int64_t kTileRows = 8;

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
// The row length of the key panels: whole vectors and one more, so that rows are not 4 KiB apart (one L1 set).
int64_t key_ld(int64_t Tk) { return round_up(Tk, kW) + kW; }

// c[r, 0:NV*16] = alpha * sum_p a[r*ars + p*acs] * b[p*ldb + 0:NV*16] (+ c when accumulate), for r < R.
template <int R, int NV>
inline __attribute__((always_inline)) void tile(int64_t k, const float* a, int64_t ars, int64_t acs,
                                                const float* b, int64_t ldb, float* c, int64_t ldc, float alpha,
                                                bool accumulate) {
  vf acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = vf{};
  for (int64_t p = 0; p < k; ++p) {
    vf bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + p * ldb + v * kW);
    for (int r = 0; r < R; ++r) {
      const float x = a[r * ars + p * acs];
      for (int v = 0; v < NV; ++v) acc[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* cp = c + r * ldc + v * kW;
      vf out = acc[r][v] * alpha;
      if (accumulate) out += load(cp);
      store(cp, out);
    }
}

template <int R>
void tile_row(int64_t n, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b, int64_t ldb, float* c,
              int64_t ldc, float alpha, bool accumulate) {
  int64_t j = 0;
  for (; j + 2 * kW <= n; j += 2 * kW) tile<R, 2>(k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, accumulate);
  if (j < n) tile<R, 1>(k, a, ars, acs, b + j, ldb, c + j, ldc, alpha, accumulate);
}

// C[m, n] = alpha * A[m, k] B[k, n] (+ C), n a multiple of 16; A is read through strides
// (ars, acs) so that a transposed operand needs no copy; B is row-major.
void small_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t ars, int64_t acs, const float* b,
                int64_t ldb, float* c, int64_t ldc, float alpha, bool accumulate) {
  int64_t i = 0;
  for (; i + kTileRows <= m; i += kTileRows)
    tile_row<kTileRows>(n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, accumulate);
  // The last m - i < kTileRows rows: one instantiation per count.
  static constexpr decltype(&tile_row<1>) kRest[] = {tile_row<1>, tile_row<2>, tile_row<3>, tile_row<4>,
                                                      tile_row<5>, tile_row<6>, tile_row<7>};
  if (i < m) kRest[m - i - 1](n, k, a + i * ars, ars, acs, b, ldb, c + i * ldc, ldc, alpha, accumulate);
}

// panel[c, j] = x[j, c] for j < t, zero for t <= j < ld: keys or values as a [C, ld] panel.
// x is a packed [t, cols] copy; the loop writes panel rows in order (strided stores are what
// makes a transpose slow) and reads x down a column, whose lines stay in L1 across c.
void transpose_panel(const float* x, int64_t t, int64_t cols, float* panel, int64_t ld) {
  for (int64_t c = 0; c < cols; ++c) {
    float* pr = panel + c * ld;
    for (int64_t j = 0; j < t; ++j) pr[j] = x[j * cols + c];
    zero(pr + t, pr + ld);
  }
}

// Scores of query rows [i0, i0 + m) against keys [0, n16): S = scale * Q K^T, one row tile at a time so that causal
// tiles stop near the diagonal; columns a tile does not reach are zeroed up to n16.
void scores(const float* qp, int64_t qst, int64_t E, const float* kt, int64_t ldk, int64_t i0, int64_t m,
            int64_t Tk, bool causal, float scale, float* S, int64_t n16) {
  for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, m - r0);
    const int64_t nt = causal ? round_up(std::min<int64_t>(Tk, i0 + r0 + rows), kW) : n16;
    small_gemm(rows, nt, E, qp + (i0 + r0) * qst, qst, 1, kt, ldk, S + r0 * n16, n16, scale, false);
    for (int64_t r = r0; r < r0 + rows; ++r) zero(S + r * n16 + nt, S + (r + 1) * n16);
  }
}

// Copies rows [0, t) of a strided [t, cols] operand into a contiguous buffer, and back.
void pack_rows(const float* x, int64_t st, int64_t t, int64_t cols, float* dst) {
  for (int64_t j = 0; j < t; ++j) {
    const float* xr = x + j * st;
    float* dr = dst + j * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dr[c] = xr[c];
  }
}
void unpack_rows(const float* src, int64_t t, int64_t cols, float* x, int64_t st) {
  for (int64_t j = 0; j < t; ++j) {
    const float* sr = src + j * cols;
    float* xr = x + j * st;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) xr[c] = sr[c];
  }
}

// Rows [0, t) of src (row stride ss) into dst (row stride ds), each row rotated (kernels/rope.h)
// at positions pos0, pos0 + 1, ...: forward (sign 1) when packing q and k, inverse (sign -1)
// when writing out the gradients of rotated operands. Without rotation a plain copy.
void copy_rows_rotated(const AttentionDims& d, const float* src, int64_t ss, int64_t t, int64_t cols, int64_t pos0,
                       float* dst, int64_t ds, float sign) {
  if (!d.rope_cos) return ds == cols ? pack_rows(src, ss, t, cols, dst) : unpack_rows(src, t, cols, dst, ds);
  const int64_t half = cols / 2;
  for (int64_t j = 0; j < t; ++j) {
    const float *sr = src + j * ss, *c = d.rope_cos + (pos0 + j) * half, *s = d.rope_sin + (pos0 + j) * half;
    float* dr = dst + j * ds;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = sr[i], b = sr[i + half], si = sign * s[i];
      dr[i] = a * c[i] - b * si;
      dr[i + half] = b * c[i] + a * si;
    }
  }
}

// One thread's buffers, carved in order from its block of the workspace. With base == nullptr
// only `size` is computed: attention_workspace_avx512 and the loops share this one layout.
struct Carve {
  float* base;
  int64_t size = 0;
  float* take(int64_t n) {
    float* p = base ? base + size : nullptr;
    size += n;
    return p;
  }
};
struct ForwardBuffers {
  float *S, *KT, *Qc, *Kc, *Vc, *Oc;
  int64_t size;
};
ForwardBuffers forward_buffers(const AttentionDims& d, float* base) {
  const int64_t rb = std::min<int64_t>(kRowBlock, d.Tq), ldk = key_ld(d.Tk);
  Carve c{base};
  ForwardBuffers f{};
  f.S = c.take(rb * ldk), f.KT = c.take(d.E * ldk), f.Qc = c.take(d.Tq * d.E), f.Kc = c.take(d.Tk * d.E);
  f.Vc = c.take(d.Tk * d.Ev), f.Oc = c.take(d.Tq * d.Ev);
  f.size = c.size;
  return f;
}
struct BackwardBuffers {
  float *P, *dP, *KT, *VT, *D, *Qc, *dQc, *Gc, *Kc, *dKc, *dVc, *Vc;
  int64_t size;
};
BackwardBuffers backward_buffers(const AttentionDims& d, float* base) {
  const int64_t rb = std::min<int64_t>(kRowBlock, d.Tq), ldk = key_ld(d.Tk);
  Carve c{base};
  BackwardBuffers g{};
  g.P = c.take(rb * ldk), g.dP = c.take(rb * ldk), g.KT = c.take(d.E * ldk), g.VT = c.take(d.Ev * ldk);
  g.D = c.take(d.Tq), g.Qc = c.take(d.Tq * d.E), g.dQc = c.take(d.Tq * d.E), g.Gc = c.take(d.Tq * d.Ev);
  g.Kc = c.take(d.Tk * d.E), g.dKc = c.take(d.Tk * d.E), g.dVc = c.take(d.Tk * d.Ev), g.Vc = c.take(d.Tk * d.Ev);
  g.size = c.size;
  return g;
}

}  // namespace

int64_t attention_workspace_avx512(const AttentionDims& d, bool backward) {
  return backward ? backward_buffers(d, nullptr).size : forward_buffers(d, nullptr).size;
}

// Each (batch, head) first copies its operands out of their strided views (rows 3d apart in a fused projection, so a
// [T, hd] head spans T pages) into contiguous buffers that stay in the core's L2 for all the products that follow.
void attention_forward_avx512(const AttentionDims& d, HeadsF32 Q, HeadsF32 K, HeadsF32 V, HeadsF32 O, float* L,
                              float* workspace) {
  const int64_t B = d.B, H = d.H, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const int64_t bh_count = B * H, ldk = key_ld(Tk), G = H / d.Hkv;
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = forward_buffers(d, nullptr).size;
    // Named pointers, not a structured binding, which clang 14 cannot capture into an OpenMP region.
    const ForwardBuffers buf = forward_buffers(d, workspace + thread_index() * size);
    float *const S = buf.S, *const KT = buf.KT, *const Qc = buf.Qc, *const Kc = buf.Kc, *const Vc = buf.Vc;
    float* const Oc = buf.Oc;
    int64_t packed = -1;  // the (batch, key/value head) in KT and Vc: a thread's heads are consecutive
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* lp = L + bh * Tq;
      copy_rows_rotated(d, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc, E, 1.f);
      if (b * d.Hkv + h / G != packed) {
        packed = b * d.Hkv + h / G;
        copy_rows_rotated(d, at(K, b, h / G), K.st, Tk, E, d.k_pos, Kc, E, 1.f);
        pack_rows(at(V, b, h / G), V.st, Tk, Ev, Vc);
        transpose_panel(Kc, Tk, E, KT, ldk);
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min<int64_t>(kRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk, n16 = round_up(n, kW);
        scores(Qc, E, E, KT, ldk, i0, m, Tk, d.causal, d.scale, S, n16);
        for (int64_t r = 0; r < m; ++r) lp[i0 + r] = softmax_row(S + r * n16, d.causal ? i0 + r + 1 : n, n16);
        // O = P V, each row tile summing only over the keys it sees.
        for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
          const int64_t rows = std::min<int64_t>(kTileRows, m - r0), kn = d.causal ? i0 + r0 + rows : n;
          small_gemm(rows, Ev, kn, S + r0 * n16, n16, 1, Vc, Ev, Oc + (i0 + r0) * Ev, Ev, 1.f, false);
        }
      }
      unpack_rows(Oc, Tq, Ev, at(O, b, h), O.st);
    }
  }
}

void attention_backward_avx512(const AttentionDims& d, HeadsF32 G, HeadsF32 Q, HeadsF32 K, HeadsF32 V, HeadsF32 O,
                               const float* L, HeadsF32 DQ, HeadsF32 DK, HeadsF32 DV, float* workspace) {
  const int64_t B = d.B, H = d.H, Hkv = d.Hkv, Tq = d.Tq, E = d.E, Tk = d.Tk, Ev = d.Ev;
  const float scale = d.scale;  // in a register through the loops that store floats
  const int64_t task_count = B * Hkv, ldk = key_ld(Tk), group = H / Hkv;
#pragma omp parallel if (d.parallel)
  {
    const int64_t size = backward_buffers(d, nullptr).size;
    const BackwardBuffers buf = backward_buffers(d, workspace + thread_index() * size);
    float *const P = buf.P, *const dP = buf.dP, *const KT = buf.KT, *const VT = buf.VT, *const D = buf.D;
    float *const Qc = buf.Qc, *const dQc = buf.dQc, *const Gc = buf.Gc, *const Kc = buf.Kc, *const dKc = buf.dKc;
    float *const dVc = buf.dVc, *const Vc = buf.Vc;
    // One task per (batch, key/value head): its query heads run in turn and sum into dK, dV.
#pragma omp for schedule(static)
    for (int64_t task = 0; task < task_count; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      copy_rows_rotated(d, at(K, b, hk), K.st, Tk, E, d.k_pos, Kc, E, 1.f);
      pack_rows(at(V, b, hk), V.st, Tk, Ev, Vc);
      transpose_panel(Kc, Tk, E, KT, ldk);
      transpose_panel(Vc, Tk, Ev, VT, ldk);
      zero(dKc, dKc + Tk * E);
      zero(dVc, dVc + Tk * Ev);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const float *op = at(O, b, h), *gp = at(G, b, h), *lp = L + (b * H + h) * Tq;
        copy_rows_rotated(d, at(Q, b, h), Q.st, Tq, E, d.q_pos, Qc, E, 1.f);
        pack_rows(gp, G.st, Tq, Ev, Gc);
        for (int64_t i = 0; i < Tq; ++i) {
          const float *g = Gc + i * Ev, *o = op + i * O.st;
          for (int64_t c = 0; c < Ev && i + 8 < Tq; c += kW) __builtin_prefetch(o + 8 * O.st + c);  // rows H apart
          float s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < Ev; ++c) s += g[c] * o[c];
          D[i] = s;
        }
        for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
          const int64_t m = std::min<int64_t>(kRowBlock, Tq - i0), n = d.causal ? i0 + m : Tk, n16 = round_up(n, kW);
          scores(Qc, E, E, KT, ldk, i0, m, Tk, d.causal, d.scale, P, n16);
          // dP = dO V^T over the same columns.
          for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
            const int64_t rows = std::min<int64_t>(kTileRows, m - r0);
            const int64_t nt = d.causal ? round_up(std::min<int64_t>(Tk, i0 + r0 + rows), kW) : n16;
            small_gemm(rows, nt, Ev, Gc + (i0 + r0) * Ev, Ev, 1, VT, ldk, dP + r0 * n16, n16, 1.f, false);
          }
          for (int64_t r = 0; r < m; ++r) {
            float *pr = P + r * n16, *dr = dP + r * n16;
            const int64_t valid = d.causal ? i0 + r + 1 : n;
            const float l = lp[i0 + r], di = D[i0 + r];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) {
              const float p = fast_exp(pr[j] - l);
              pr[j] = p;
              dr[j] = p * (dr[j] - di) * scale;
            }
            zero(pr + valid, pr + n16);
            zero(dr + valid, dr + n16);
          }
          // dV[0:n] += P^T dO, dK[0:n] += dS^T Q: P^T and dS^T are P and dS read with swapped strides.
          small_gemm(n, Ev, m, P, 1, n16, Gc + i0 * Ev, Ev, dVc, Ev, 1.f, true);
          small_gemm(n, E, m, dP, 1, n16, Qc + i0 * E, E, dKc, E, 1.f, true);
          // dQ = dS K, each row tile summing only over the keys it sees.
          for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
            const int64_t rows = std::min<int64_t>(kTileRows, m - r0), kn = d.causal ? i0 + r0 + rows : n;
            small_gemm(rows, E, kn, dP + r0 * n16, n16, 1, Kc, E, dQc + (i0 + r0) * E, E, 1.f, false);
          }
        }
        copy_rows_rotated(d, dQc, E, Tq, E, d.q_pos, at(DQ, b, h), DQ.st, -1.f);
      }
      copy_rows_rotated(d, dKc, E, Tk, E, d.k_pos, at(DK, b, hk), DK.st, -1.f);
      unpack_rows(dVc, Tk, Ev, at(DV, b, hk), DV.st);
    }
  }
}

}  // namespace weft::kernels::cpu
