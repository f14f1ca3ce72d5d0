// kernels/cpu: fused scaled-dot-product attention. Each (batch, head) pair is one task for a
// thread; within it, query rows go in blocks of kRowBlock. A block's scores against the keys
// it may see (under the causal mask: keys up to the block's last row, so the upper triangle
// beyond the block is never computed) form one [rows, keys] buffer that stays in the
// thread's cache, and the products around it run serially inside the task.
//
// Forward, per row block:  S = scale * Q K^T;  P = softmax(S) (masked entries 0);  O = P V,
// keeping lse = log(sum(exp(S))) per row. Backward, per row block, with D_i = dO_i . O_i:
//   P = exp(S - lse);  dV += P^T dO;  dP = dO V^T;  dS = P (dP - D) scale;
//   dQ = dS K;  dK += dS^T Q.
// The backward thus recomputes S instead of storing [B, H, T, T] probabilities.
//
// Two implementations of the same steps: f32 with head dims that are multiples of 16 on
// AVX-512 builds uses register tiles on packed copies of the operands (forward_tiled,
// backward_tiled: 10-13 % faster than the other path at GPT shapes); everything else (f64 for
// gradcheck, odd head dims, other CPUs) calls the Eigen GEMMs of kernels/cpu/gemm.h.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

// Query rows per block. Smaller blocks skip more of the masked triangle but make smaller
// products; with the Eigen products 32 was the fastest of 16/32/64/128 for head_dim 32-64
// and T 128-256 on Zen 4, and the tiled path keeps it (its dK/dV updates sum over a block).
constexpr int64_t kRowBlock = 32;

// One [B, H, T, C] operand: element (b, h, t, c) at p[b*sb + h*sh + t*st + c].
template <typename T>
struct Heads {
  T* p;
  int64_t sb, sh, st;
  explicit Heads(const Tensor& t) : p(t.data<T>()), sb(t.stride(0)), sh(t.stride(1)), st(t.stride(2)) {}
  T* at(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
};

// Overwrites s[0, n) (scaled scores of one query row, keys from `valid` on masked) with the
// softmax probabilities; returns the row's log-sum-exp.
template <typename T>
T softmax_row(T* s, int64_t valid, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    T e = fast_exp(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  T inv = T(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
  for (int64_t j = valid; j < n; ++j) s[j] = T(0);
  return mx + std::log(sum);
}

// Work (multiply-adds) below which the (batch, head) loop stays on one thread.
constexpr double kParallelWork = 1 << 18;

template <typename T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, T scale, const Tensor& out,
                   const Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const Heads<T> Q(q), K(k), V(v), O(out);
  T* L = lse.data<T>();
  const int64_t bh_count = B * H;
  [[maybe_unused]] const bool par = double(bh_count) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && bh_count > 1;
#pragma omp parallel if (par)
  {
    std::vector<T> buf(size_t(std::min(kRowBlock, Tq) * Tk));
    T* S = buf.data();
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T *qp = Q.at(b, h), *kp = K.at(b, h), *vp = V.at(b, h);
      T* op = O.at(b, h);
      T* lp = L + bh * Tq;
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk;
        // S[m, n] = scale * Q[i0:i0+m] K[0:n]^T; K^T is K read column-major.
        gemm<T>(m, n, E, qp + i0 * Q.st, row_major(Q.st), kp, col_major(K.st), S, n, scale, T(0));
        for (int64_t r = 0; r < m; ++r) lp[i0 + r] = softmax_row(S + r * n, causal ? i0 + r + 1 : n, n);
        gemm<T>(m, Ev, n, S, row_major(n), vp, row_major(V.st), op + i0 * O.st, O.st);
      }
    }
  }
}

template <typename T>
void backward_typed(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, bool causal, T scale, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const Heads<T> Q(q), K(k), V(v), O(out), G(grad), DQ(dq), DK(dk), DV(dv);
  const T* L = lse.data<T>();
  const int64_t bh_count = B * H;
  [[maybe_unused]] const bool par = double(bh_count) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && bh_count > 1;
#pragma omp parallel if (par)
  {
    const int64_t rb = std::min(kRowBlock, Tq);
    std::vector<T> buf(size_t(2 * rb * Tk + Tq));
    T* P = buf.data();
    T* dP = P + rb * Tk;
    T* D = dP + rb * Tk;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const T *qp = Q.at(b, h), *kp = K.at(b, h), *vp = V.at(b, h), *op = O.at(b, h), *gp = G.at(b, h);
      T *dqp = DQ.at(b, h), *dkp = DK.at(b, h), *dvp = DV.at(b, h);
      const T* lp = L + bh * Tq;
      // D_i = dO_i . O_i: the row sums of dP * P that the softmax backward subtracts.
      for (int64_t i = 0; i < Tq; ++i) {
        const T *g = gp + i * G.st, *o = op + i * O.st;
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < Ev; ++c) s += g[c] * o[c];
        D[i] = s;
      }
      // dK and dV accumulate over row blocks.
      for (int64_t j = 0; j < Tk; ++j) {
        std::fill_n(dkp + j * DK.st, E, T(0));
        std::fill_n(dvp + j * DV.st, Ev, T(0));
      }
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk;
        const T *qb = qp + i0 * Q.st, *gb = gp + i0 * G.st;
        gemm<T>(m, n, E, qb, row_major(Q.st), kp, col_major(K.st), P, n, scale, T(0));
        for (int64_t r = 0; r < m; ++r) {
          T* pr = P + r * n;
          const int64_t valid = causal ? i0 + r + 1 : n;
          const T l = lp[i0 + r];
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) pr[j] = fast_exp(pr[j] - l);
          for (int64_t j = valid; j < n; ++j) pr[j] = T(0);
        }
        // dV[0:n] += P^T dO; P^T is P read column-major.
        gemm<T>(n, Ev, m, P, col_major(n), gb, row_major(G.st), dvp, DV.st, T(1), T(1));
        // dP = dO V[0:n]^T
        gemm<T>(m, n, Ev, gb, row_major(G.st), vp, col_major(V.st), dP, n, T(1), T(0));
        for (int64_t r = 0; r < m; ++r) {
          T *pr = P + r * n, *dr = dP + r * n;
          const T di = D[i0 + r];
#pragma omp simd
          for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - di) * scale;
        }
        gemm<T>(m, E, n, dP, row_major(n), kp, row_major(K.st), dqp + i0 * DQ.st, DQ.st, T(1), T(0));
        gemm<T>(n, E, m, dP, col_major(n), qb, row_major(Q.st), dkp, DK.st, T(1), T(1));
      }
    }
  }
}


#if defined(__AVX512F__)
// ---- f32 path with register tiles (AVX-512 builds, head dims that are multiples of 16).
// Eigen's GEMM packs both operands on every call, which costs as much as the arithmetic at
// these sizes (tens of rows by tens of columns). Here keys and values are transposed into
// [C, Tk] panels once per (batch, head), and every product is a sweep of 8 x 32 output
// tiles held in 16 vector registers. Row tiles of 8 also follow the causal diagonal more
// closely than 32-row blocks: a tile's scores stop at the first multiple of 16 past its
// last row.
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

// c[r, 0:NV*16] = alpha * sum_p a[r*ars + p*acs] * b[p*ldb + 0:NV*16] (+ c when accumulate),
// for r < R.
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
  const float* ai = a + i * ars;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 7: tile_row<7>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 6: tile_row<6>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 5: tile_row<5>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 4: tile_row<4>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 3: tile_row<3>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 2: tile_row<2>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    case 1: tile_row<1>(n, k, ai, ars, acs, b, ldb, ci, ldc, alpha, accumulate); break;
    default: break;
  }
}

// panel[c, j] = x[j, c] for j < t, zero for t <= j < ld: keys or values as a [C, ld] panel.
// x is a packed [t, cols] copy; the loop writes panel rows in order (strided stores are what
// makes a transpose slow) and reads x down a column, whose lines stay in L1 across c.
void transpose_panel(const float* x, int64_t t, int64_t cols, float* panel, int64_t ld) {
  for (int64_t c = 0; c < cols; ++c) {
    float* pr = panel + c * ld;
    for (int64_t j = 0; j < t; ++j) pr[j] = x[j * cols + c];
    std::fill(pr + t, pr + ld, 0.f);
  }
}

bool tiled_ok(const Tensor& q, const Tensor& v) {
  return q.dtype() == DType::f32 && q.size(3) % kW == 0 && v.size(3) % kW == 0;
}

// Scores of query rows [i0, i0 + m) against keys [0, n16): S = scale * Q K^T, one row tile
// at a time so that causal tiles stop near the diagonal; columns a tile does not reach are
// zeroed up to n16.
void scores(const float* qp, int64_t qst, int64_t E, const float* kt, int64_t ldk, int64_t i0, int64_t m,
            int64_t Tk, bool causal, float scale, float* S, int64_t n16) {
  for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
    const int64_t rows = std::min(kTileRows, m - r0);
    const int64_t nt = causal ? round_up(std::min(Tk, i0 + r0 + rows), kW) : n16;
    small_gemm(rows, nt, E, qp + (i0 + r0) * qst, qst, 1, kt, ldk, S + r0 * n16, n16, scale, false);
    for (int64_t r = r0; r < r0 + rows; ++r) std::fill(S + r * n16 + nt, S + (r + 1) * n16, 0.f);
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

// Each (batch, head) first copies its operands out of their strided views (rows 3d apart in
// a fused projection, so a [T, hd] head spans T pages) into contiguous buffers that stay in
// the core's L2 for all the products that follow.
void forward_tiled(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, const Tensor& out,
                   const Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const Heads<float> Q(q), K(k), V(v), O(out);
  float* L = lse.data<float>();
  const int64_t bh_count = B * H, ldk = round_up(Tk, kW);
  [[maybe_unused]] const bool par = double(bh_count) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && bh_count > 1;
#pragma omp parallel if (par)
  {
    const int64_t rb = std::min(kRowBlock, Tq);
    std::vector<float> buf(size_t(rb * ldk + E * ldk + Tq * E + Tk * E + Tk * Ev + Tq * Ev));
    float* S = buf.data();
    float* KT = S + rb * ldk;
    float* Qc = KT + E * ldk;
    float* Kc = Qc + Tq * E;
    float* Vc = Kc + Tk * E;
    float* Oc = Vc + Tk * Ev;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      float* lp = L + bh * Tq;
      pack_rows(Q.at(b, h), Q.st, Tq, E, Qc);
      pack_rows(K.at(b, h), K.st, Tk, E, Kc);
      pack_rows(V.at(b, h), V.st, Tk, Ev, Vc);
      transpose_panel(Kc, Tk, E, KT, ldk);
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk, n16 = round_up(n, kW);
        scores(Qc, E, E, KT, ldk, i0, m, Tk, causal, scale, S, n16);
        for (int64_t r = 0; r < m; ++r) lp[i0 + r] = softmax_row(S + r * n16, causal ? i0 + r + 1 : n, n16);
        // O = P V, each row tile summing only over the keys it sees.
        for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, m - r0), kn = causal ? i0 + r0 + rows : n;
          small_gemm(rows, Ev, kn, S + r0 * n16, n16, 1, Vc, Ev, Oc + (i0 + r0) * Ev, Ev, 1.f, false);
        }
      }
      unpack_rows(Oc, Tq, Ev, O.at(b, h), O.st);
    }
  }
}

void backward_tiled(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, bool causal, float scale, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const Heads<float> Q(q), K(k), V(v), O(out), G(grad), DQ(dq), DK(dk), DV(dv);
  const float* L = lse.data<float>();
  const int64_t bh_count = B * H, ldk = round_up(Tk, kW);
  [[maybe_unused]] const bool par = double(bh_count) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && bh_count > 1;
#pragma omp parallel if (par)
  {
    const int64_t rb = std::min(kRowBlock, Tq);
    std::vector<float> buf(size_t(2 * rb * ldk + (E + Ev) * ldk + Tq + 2 * Tq * E + Tq * Ev + 2 * Tk * E +
                                  2 * Tk * Ev));
    float* P = buf.data();
    float* dP = P + rb * ldk;
    float* KT = dP + rb * ldk;
    float* VT = KT + E * ldk;
    float* D = VT + Ev * ldk;
    float* Qc = D + Tq;
    float* dQc = Qc + Tq * E;
    float* Gc = dQc + Tq * E;
    float* Kc = Gc + Tq * Ev;
    float* dKc = Kc + Tk * E;
    float* dVc = dKc + Tk * E;
    float* Vc = dVc + Tk * Ev;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      const float *op = O.at(b, h), *gp = G.at(b, h);
      const float* lp = L + bh * Tq;
      pack_rows(Q.at(b, h), Q.st, Tq, E, Qc);
      pack_rows(K.at(b, h), K.st, Tk, E, Kc);
      pack_rows(V.at(b, h), V.st, Tk, Ev, Vc);
      pack_rows(gp, G.st, Tq, Ev, Gc);
      transpose_panel(Kc, Tk, E, KT, ldk);
      transpose_panel(Vc, Tk, Ev, VT, ldk);
      for (int64_t i = 0; i < Tq; ++i) {
        const float *g = Gc + i * Ev, *o = op + i * O.st;
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < Ev; ++c) s += g[c] * o[c];
        D[i] = s;
      }
      std::fill_n(dKc, Tk * E, 0.f);
      std::fill_n(dVc, Tk * Ev, 0.f);
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk, n16 = round_up(n, kW);
        scores(Qc, E, E, KT, ldk, i0, m, Tk, causal, scale, P, n16);
        // dP = dO V^T over the same columns.
        for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, m - r0);
          const int64_t nt = causal ? round_up(std::min(Tk, i0 + r0 + rows), kW) : n16;
          small_gemm(rows, nt, Ev, Gc + (i0 + r0) * Ev, Ev, 1, VT, ldk, dP + r0 * n16, n16, 1.f, false);
        }
        for (int64_t r = 0; r < m; ++r) {
          float *pr = P + r * n16, *dr = dP + r * n16;
          const int64_t valid = causal ? i0 + r + 1 : n;
          const float l = lp[i0 + r], di = D[i0 + r];
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) {
            const float p = fast_exp(pr[j] - l);
            pr[j] = p;
            dr[j] = p * (dr[j] - di) * scale;
          }
          std::fill(pr + valid, pr + n16, 0.f);
          std::fill(dr + valid, dr + n16, 0.f);
        }
        // dV[0:n] += P^T dO, dK[0:n] += dS^T Q: P^T and dS^T are P and dS read with swapped strides.
        small_gemm(n, Ev, m, P, 1, n16, Gc + i0 * Ev, Ev, dVc, Ev, 1.f, true);
        small_gemm(n, E, m, dP, 1, n16, Qc + i0 * E, E, dKc, E, 1.f, true);
        // dQ = dS K, each row tile summing only over the keys it sees.
        for (int64_t r0 = 0; r0 < m; r0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, m - r0), kn = causal ? i0 + r0 + rows : n;
          small_gemm(rows, E, kn, dP + r0 * n16, n16, 1, Kc, E, dQc + (i0 + r0) * E, E, 1.f, false);
        }
      }
      unpack_rows(dQc, Tq, E, DQ.at(b, h), DQ.st);
      unpack_rows(dKc, Tk, E, DK.at(b, h), DK.st);
      unpack_rows(dVc, Tk, Ev, DV.at(b, h), DV.st);
    }
  }
}
#endif  // __AVX512F__

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, const Tensor& out,
               const Tensor& lse) {
#if defined(__AVX512F__)
  if (tiled_ok(q, v)) return forward_tiled(q, k, v, causal, float(scale), out, lse);
#endif
  if (q.dtype() == DType::f64) forward_typed<double>(q, k, v, causal, scale, out, lse);
  else forward_typed<float>(q, k, v, causal, float(scale), out, lse);
}

void attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
#if defined(__AVX512F__)
  if (tiled_ok(q, v)) return backward_tiled(grad, q, k, v, out, lse, causal, float(scale), dq, dk, dv);
#endif
  if (q.dtype() == DType::f64)
    backward_typed<double>(grad, q, k, v, out, lse, causal, scale, dq, dk, dv);
  else backward_typed<float>(grad, q, k, v, out, lse, causal, float(scale), dq, dk, dv);
}

}  // namespace weft::kernels::cpu
