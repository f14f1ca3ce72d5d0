// kernels/cpu: fused scaled-dot-product attention. Each (batch, head) pair is one task for a thread; within it, query
// rows go in blocks of kRowBlock. A block's scores against the keys it may see (under the causal mask: keys up to the
// block's last row, so the upper triangle beyond the block is never computed) form one [rows, keys] buffer that stays
// in the thread's cache, and the products around it run serially inside the task.
//
// Forward, per row block:  S = scale * Q K^T;  P = softmax(S) (masked entries 0);  O = P V,
// keeping lse = log(sum(exp(S))) per row. Backward, per row block, with D_i = dO_i . O_i:
//   P = exp(S - lse);  dV += P^T dO;  dP = dO V^T;  dS = P (dP - D) scale;
//   dQ = dS K;  dK += dS^T Q.
// The backward thus recomputes S instead of storing [B, H, T, T] probabilities.
//
// Grouped-query attention: query head h reads key/value head h / G (G = H / Hkv). The forward runs one task per (batch,
// query head); the backward one per (batch, key/value head), whose query heads run in turn and sum into that head's dK
// and dV. Rotary embeddings: q and k rows are rotated into the task's buffers as they are read; dQ and dK are computed
// for the rotated operands and rotated back (the inverse rotation is the transpose) when written out.
//
// A single query row per head (a decode step against a key/value cache) takes its own loop in f32 and f64: one task per
// (batch, key/value head) reads the cached rows in place, once for the whole group of query heads (decode_typed).
//
// Three implementations of the same steps: f32 with head dims that are multiples of 16 on CPUs with AVX-512 uses
// register tiles (attention_avx512.cpp, chosen at run time; also bf16 on widened heads where no bf16 kernel runs);
// bf16 with such head dims on CPUs with AVX512_BF16 tiles on bf16 pairs (attention_avx512bf16.cpp), or AMX tiles
// where the bf16 GEMM runs on them (attention_amx.cpp: WEFT_CPU_BF16_GEMM picks both); everything else (f64 for
// gradcheck, odd head dims, f16, other CPUs) calls the GEMMs of kernels/cpu/gemm.h.
// 16-bit operands the bf16 tiles do not take are computed in f32: each task widens its own heads into its buffers as it
// reads them (as it rotates them) and rounds what it writes, so no f32 copy of a whole operand is made.
#include "kernels/cpu/attention.h"

#include "core/allocator.h"
#include "core/copy.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/attention_tiled.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/fast_math.h"

namespace weft::kernels::cpu {
namespace {

// Query rows per block. Smaller blocks skip more of the masked triangle but make smaller
// products; with the Eigen products 32 was the fastest of 16/32/64/128 for head_dim 32-64
// and T 128-256 on Zen 4 (the tiled loops choose their own: attention_avx512.cpp, attention_bf16_loops.h).
constexpr int64_t kRowBlock = 32;

// One [B, H, T, C] operand: element (b, h, t, c) at p[b*sb + h*sh + t*st + c].
template <typename T>
struct Heads {
  T* p;
  int64_t sb, sh, st;
  explicit Heads(const Tensor& t) : p(t.data<T>()), sb(t.stride(0)), sh(t.stride(1)), st(t.stride(2)) {}
  T* at(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
};

// Work (multiply-adds) below which the (batch, head) loop stays on one thread.
constexpr double kParallelWork = 1 << 18;

// Overwrites s[0, n) (scaled scores of one query row, keys from `valid` on masked) with the softmax probabilities;
// returns the row's log-sum-exp.
template <typename T>
T row_softmax(T* s, int64_t valid, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < valid; ++j) mx = s[j] > mx ? s[j] : mx;
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

// The rotation of rows at positions pos0, pos0 + 1, ... (kernels/rope.h), or none.
template <typename T>
struct Rotation {
  const T *cos = nullptr, *sin = nullptr;
  int64_t half = 0;
  explicit Rotation(const RopeTables& t) {
    if (!t.cos.defined()) return;
    cos = t.cos.data<T>(), sin = t.sin.data<T>(), half = t.cos.size(1);
  }
  bool on() const { return cos != nullptr; }
  // dst[r] = rotated src[r] for r < rows (row strides ss and ds; dst may be src for in place).
  void rows(const T* src, int64_t ss, int64_t rows, int64_t pos0, T* dst, int64_t ds, bool inverse) const {
    const T sign = inverse ? T(-1) : T(1);
    for (int64_t r = 0; r < rows; ++r) {
      const T *x = src + r * ss, *c = cos + (pos0 + r) * half, *s = sin + (pos0 + r) * half;
      T* y = dst + r * ds;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = x[i], b = x[i + half], si = sign * s[i];
        y[i] = a * c[i] - b * si;
        y[i + half] = b * c[i] + a * si;
      }
    }
  }
};

// A head's rows as T: in place when stored as T; 16-bit ones widened into `buf` (`cols` apart,
// which *st becomes), so that a task holds f32 copies of its own heads only.
template <typename T, typename S>
T* rows_as(S* p, int64_t* st, int64_t rows, int64_t cols, T* buf) {
  if constexpr (std::is_same_v<S, T>) {
    return p;
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) buf[r * cols + c] = T(p[r * *st + c]);
    *st = cols;
    return buf;
  }
}

// dst's rows (row stride dst_st) = src's (cols apart), rounded to S; nothing when S is T.
template <typename T, typename S>
void rows_to(const T* src, int64_t rows, int64_t cols, S* dst, int64_t dst_st) {
  if constexpr (!std::is_same_v<S, T>)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * dst_st + c] = convert_scalar<S>(src[r * cols + c]);
}

// S: how q, k, v and out are stored (T, or a 16-bit type computed in T = f32).
// Scratch of `per_thread` elements for each thread a region (parallel if `par`) may use, taken before it (inside an
// OpenMP region a failed allocation would end the process), uninitialised: the loops write what they read. More than
// the machine holds is refused untried.
template <typename T>
std::unique_ptr<T[]> thread_scratch(bool par, int64_t per_thread) {
  const int64_t threads = par ? thread_count() : 1;
  try {
    if (double(threads) * double(per_thread) * sizeof(T) <= double(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE))
      return std::make_unique_for_overwrite<T[]>(size_t(threads * per_thread));
  } catch (const std::exception&) {  // bad_alloc
  }
  throw OutOfMemoryError(fmt::format("attention: no memory for {} thread(s)' scratch of {} bytes each", threads,
                                     double(per_thread) * sizeof(T)));
}
template <typename T>
T* own_block(const std::unique_ptr<T[]>& scratch, int64_t per_thread) { return scratch.get() + thread_index() * per_thread; }

template <typename T, typename S = T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, T scale,
                   const AttentionRope& rope, const Tensor& out, const Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const int64_t G = H / k.size(1);
  const Heads<S> Q(q), K(k), V(v), O(out);
  const Rotation<T> rot(rope.tables);
  T* L = lse.data<T>();
  const int64_t bh_count = B * H;
  [[maybe_unused]] const bool par = double(bh_count) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && bh_count > 1;
  constexpr bool wide = !std::is_same_v<S, T>;
  const int64_t n_s = std::min(kRowBlock, Tq) * Tk, n_rot = rot.on() ? (Tq + Tk) * E : 0;
  const int64_t per_thread = n_s + n_rot + (wide ? (Tq + Tk) * (E + Ev) : 0);  // scores, rotated q k, widened q k v out
  const std::unique_ptr<T[]> scratch = thread_scratch<T>(par, per_thread);
#pragma omp parallel if (par)
  {
    T* const Sc = own_block(scratch, per_thread);
    T* const rotated = Sc + n_s;
    T* const widened = rotated + n_rot;
#pragma omp for schedule(static)
    for (int64_t bh = 0; bh < bh_count; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      int64_t qst = Q.st, kst = K.st, vst = V.st, ost = O.st;
      T* w = widened;
      const T* qp = rows_as<T>(Q.at(b, h), &qst, Tq, E, w);
      const T* kp = rows_as<T>(K.at(b, h / G), &kst, Tk, E, w + Tq * E);
      const T* vp = rows_as<T>(V.at(b, h / G), &vst, Tk, Ev, w + (Tq + Tk) * E);
      T* op;
      if constexpr (wide) op = w + (Tq + Tk) * E + Tk * Ev, ost = Ev;
      else op = O.at(b, h);
      if (rot.on()) {
        T *qr = rotated, *kr = qr + Tq * E;
        rot.rows(qp, qst, Tq, rope.q_pos, qr, E, false);
        rot.rows(kp, kst, Tk, rope.k_pos, kr, E, false);
        qp = qr, kp = kr, qst = kst = E;
      }
      T* lp = L + bh * Tq;
      for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
        const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk;
        // S[m, n] = scale * Q[i0:i0+m] K[0:n]^T; K^T is K read column-major.
        gemm<T>(m, n, E, qp + i0 * qst, row_major(qst), kp, col_major(kst), Sc, n, scale, T(0));
        for (int64_t r = 0; r < m; ++r) lp[i0 + r] = row_softmax(Sc + r * n, causal ? i0 + r + 1 : n, n);
        gemm<T>(m, Ev, n, Sc, row_major(n), vp, row_major(vst), op + i0 * ost, ost);
      }
      rows_to(op, Tq, Ev, O.at(b, h), O.st);
    }
  }
}

// One query row per head (a decode step against a key/value cache): one task per (batch,
// key/value head) reads each cached key and value row once, in place (any row stride: a cache
// is a view into a longer buffer), for all G query heads that share it; nothing is packed or
// transposed, so a step costs one pass over the cache. Keys are rotated as they are read.
template <typename T>
void decode_typed(const Tensor& q, const Tensor& k, const Tensor& v, T scale, const AttentionRope& rope,
                  const Tensor& out, const Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), E = q.size(3), Tk = k.size(2), Ev = v.size(3), Hkv = k.size(1);
  const int64_t G = H / Hkv;
  const Heads<T> Q(q), K(k), V(v), O(out);
  const Rotation<T> rot(rope.tables);
  T* L = lse.data<T>();
  [[maybe_unused]] const bool par = double(B * H) * double(Tk) * double(E + Ev) > kParallelWork && B * Hkv > 1;
  const int64_t per_thread = G * Tk + G * E + E + G * Ev;  // scores, scaled queries, a rotated key, sums
  const std::unique_ptr<T[]> scratch = thread_scratch<T>(par, per_thread);
#pragma omp parallel if (par)
  {
    T* const S = own_block(scratch, per_thread);
    T *const Qr = S + G * Tk, *const Kr = Qr + G * E, *const Acc = Kr + E;
#pragma omp for schedule(static)
    for (int64_t bk = 0; bk < B * Hkv; ++bk) {
      const int64_t b = bk / Hkv, hk = bk % Hkv;
      for (int64_t g = 0; g < G; ++g) {
        T* qr = Qr + g * E;
        if (rot.on()) rot.rows(Q.at(b, hk * G + g), 0, 1, rope.q_pos, qr, E, false);
        else std::copy_n(Q.at(b, hk * G + g), E, qr);
        for (int64_t i = 0; i < E; ++i) qr[i] *= scale;
      }
      for (int64_t j = 0; j < Tk; ++j) {
        const T* kj = K.at(b, hk) + j * K.st;
        if (rot.on()) rot.rows(kj, 0, 1, rope.k_pos + j, Kr, E, false), kj = Kr;
        for (int64_t g = 0; g < G; ++g) {
          const T* qr = Qr + g * E;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < E; ++i) dot += qr[i] * kj[i];
          S[g * Tk + j] = dot;
        }
      }
      for (int64_t g = 0; g < G; ++g) L[(b * H + hk * G + g)] = row_softmax(S + g * Tk, Tk, Tk);
      std::fill_n(Acc, G * Ev, T(0));
      for (int64_t j = 0; j < Tk; ++j) {
        const T* vj = V.at(b, hk) + j * V.st;
        for (int64_t g = 0; g < G; ++g) {
          T* acc = Acc + g * Ev;
          const T p = S[g * Tk + j];
#pragma omp simd
          for (int64_t i = 0; i < Ev; ++i) acc[i] += p * vj[i];
        }
      }
      for (int64_t g = 0; g < G; ++g) std::copy_n(Acc + g * Ev, Ev, O.at(b, hk * G + g));
    }
  }
}

template <typename T, typename S = T>
void backward_typed(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, bool causal, T scale, const AttentionRope& rope, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2), Ev = v.size(3);
  const int64_t Hkv = k.size(1), G = H / Hkv;
  const Heads<S> Q(q), K(k), V(v), O(out), Gr(grad), DQ(dq), DK(dk), DV(dv);
  constexpr bool wide = !std::is_same_v<S, T>;
  const Rotation<T> rot(rope.tables);
  const T* L = lse.data<T>();
  const int64_t task_count = B * Hkv;
  [[maybe_unused]] const bool par =
      double(B * H) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && task_count > 1;
  const int64_t rb = std::min(kRowBlock, Tq), n_p = 2 * rb * Tk + Tq, n_rot = rot.on() ? (Tq + Tk) * E : 0;
  // P, dP and D; rotated q and k; 16-bit heads widened: k, v, dk, dv, then q, out, grad, dq
  const int64_t per_thread = n_p + n_rot + (wide ? 2 * Tk * (E + Ev) + Tq * (2 * E + 2 * Ev) : 0);
  const std::unique_ptr<T[]> scratch = thread_scratch<T>(par, per_thread);
#pragma omp parallel if (par)
  {
    T* const P = own_block(scratch, per_thread);
    T *const rotated = P + n_p, *const widened = rotated + n_rot;
    T* dP = P + rb * Tk;
    T* D = dP + rb * Tk;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < task_count; ++task) {
      const int64_t b = task / Hkv, hk = task % Hkv;
      int64_t kst = K.st, vst = V.st, dkst = DK.st, dvst = DV.st;
      T* w = widened;
      const T* kp = rows_as<T>(K.at(b, hk), &kst, Tk, E, w);
      const T* vp = rows_as<T>(V.at(b, hk), &vst, Tk, Ev, w + Tk * E);
      T *dkp, *dvp, *wq = w + 2 * Tk * (E + Ev);
      if constexpr (wide) dkp = w + Tk * (E + Ev), dvp = dkp + Tk * E, dkst = E, dvst = Ev;
      else dkp = DK.at(b, hk), dvp = DV.at(b, hk);
      T* qr = rotated;
      if (rot.on()) {
        T* kr = qr + Tq * E;
        rot.rows(kp, kst, Tk, rope.k_pos, kr, E, false);
        kp = kr, kst = E;
      }
      // dK and dV accumulate over the group's query heads and their row blocks.
      for (int64_t j = 0; j < Tk; ++j) {
        std::fill_n(dkp + j * dkst, E, T(0));
        std::fill_n(dvp + j * dvst, Ev, T(0));
      }
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        int64_t qst = Q.st, ost = O.st, gst = Gr.st, dqst = DQ.st;
        const T* qp = rows_as<T>(Q.at(b, h), &qst, Tq, E, wq);
        const T* op = rows_as<T>(O.at(b, h), &ost, Tq, Ev, wq + Tq * E);
        const T* gp = rows_as<T>(Gr.at(b, h), &gst, Tq, Ev, wq + Tq * (E + Ev));
        T* dqp;
        if constexpr (wide) dqp = wq + Tq * (E + 2 * Ev), dqst = E;
        else dqp = DQ.at(b, h);
        const T* lp = L + (b * H + h) * Tq;
        if (rot.on()) {
          rot.rows(qp, qst, Tq, rope.q_pos, qr, E, false);
          qp = qr, qst = E;
        }
        // D_i = dO_i . O_i: the row sums of dP * P that the softmax backward subtracts.
        for (int64_t i = 0; i < Tq; ++i) {
          const T *g = gp + i * gst, *o = op + i * ost;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < Ev; ++c) s += g[c] * o[c];
          D[i] = s;
        }
        for (int64_t i0 = 0; i0 < Tq; i0 += kRowBlock) {
          const int64_t m = std::min(kRowBlock, Tq - i0), n = causal ? i0 + m : Tk;
          const T *qb = qp + i0 * qst, *gb = gp + i0 * gst;
          gemm<T>(m, n, E, qb, row_major(qst), kp, col_major(kst), P, n, scale, T(0));
          for (int64_t r = 0; r < m; ++r) {
            T* pr = P + r * n;
            const int64_t valid = causal ? i0 + r + 1 : n;
            const T l = lp[i0 + r];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) pr[j] = fast_exp(pr[j] - l);
            for (int64_t j = valid; j < n; ++j) pr[j] = T(0);
          }
          // dV[0:n] += P^T dO; P^T is P read column-major.
          gemm<T>(n, Ev, m, P, col_major(n), gb, row_major(gst), dvp, dvst, T(1), T(1));
          // dP = dO V[0:n]^T
          gemm<T>(m, n, Ev, gb, row_major(gst), vp, col_major(vst), dP, n, T(1), T(0));
          for (int64_t r = 0; r < m; ++r) {
            T *pr = P + r * n, *dr = dP + r * n;
            const T di = D[i0 + r];
#pragma omp simd
            for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - di) * scale;
          }
          gemm<T>(m, E, n, dP, row_major(n), kp, row_major(kst), dqp + i0 * dqst, dqst, T(1), T(0));
          gemm<T>(n, E, m, dP, col_major(n), qb, row_major(qst), dkp, dkst, T(1), T(1));
        }
        if (rot.on()) rot.rows(dqp, dqst, Tq, rope.q_pos, dqp, dqst, true);
        rows_to(dqp, Tq, E, DQ.at(b, h), DQ.st);
      }
      if (rot.on()) rot.rows(dkp, dkst, Tk, rope.k_pos, dkp, dkst, true);
      rows_to(dkp, Tk, E, DK.at(b, hk), DK.st);
      rows_to(dvp, Tk, Ev, DV.at(b, hk), DV.st);
    }
  }
}

HeadsF32 heads_f32(const Tensor& t) { return {t.data<float>(), t.stride(0), t.stride(1), t.stride(2)}; }

AttentionDims dims_of(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                      const AttentionRope& rope, bool backward) {
  const int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1), Tq = q.size(2), E = q.size(3), Tk = k.size(2),
                Ev = v.size(3);
  const int64_t tasks = backward ? B * Hkv : B * H;
  const bool par = double(B * H) * double(Tq) * double(Tk) * double(E + Ev) > kParallelWork && tasks > 1;
  AttentionDims d{B, H, Hkv, Tq, Tk, E, Ev, causal, float(scale), par};
  if (rope.on()) {
    d.rope_cos = rope.tables.cos.data<float>(), d.rope_sin = rope.tables.sin.data<float>();
    d.q_pos = rope.q_pos, d.k_pos = rope.k_pos;
  }
  return d;
}

HeadsBF16 heads_bf16(const Tensor& t) {
  return {reinterpret_cast<uint16_t*>(t.data<BFloat16>()), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace

bool attention_uses_tiles(const Tensor& q, const Tensor& v) {
#ifdef __x86_64__
  const bool dims = q.size(3) % 16 == 0 && v.size(3) % 16 == 0;
  if (q.dtype() == DType::bf16) return dims && (bf16_gemm_native() || is_avx512(sgemm_kernel()));
  return q.dtype() == DType::f32 && dims && is_avx512(sgemm_kernel());
#else
  (void)q, (void)v;
  return false;
#endif
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
               const AttentionRope& rope, const Tensor& out, const Tensor& lse) {
  if (q.size(2) == 1 && (q.dtype() == DType::f32 || q.dtype() == DType::f64)) {  // a decode step
    if (q.dtype() == DType::f64) return decode_typed<double>(q, k, v, scale, rope, out, lse);
    return decode_typed<float>(q, k, v, float(scale), rope, out, lse);
  }
  if (attention_uses_tiles(q, v)) {
    const AttentionDims d = dims_of(q, k, v, causal, scale, rope, false);
    if (q.dtype() == DType::bf16 && bf16_gemm_native()) {
      const std::unique_ptr<char[]> ws = thread_scratch<char>(d.parallel, attention_workspace_avx512bf16(d, false));
      auto* forward = bgemm_kernel() == BgemmKernel::amx ? attention_forward_amx : attention_forward_avx512bf16;
      return forward(d, heads_bf16(q), heads_bf16(k), heads_bf16(v), heads_bf16(out), lse.data<float>(), ws.get());
    }
    const bool bf16 = q.dtype() == DType::bf16;
    const std::unique_ptr<char[]> ws = thread_scratch<char>(d.parallel, attention_workspace_avx512(d, false, bf16));
    if (bf16)  // the f32 tiles on widened heads
      return attention_forward_avx512(d, heads_bf16(q), heads_bf16(k), heads_bf16(v), heads_bf16(out),
                                      lse.data<float>(), ws.get());
    return attention_forward_avx512(d, heads_f32(q), heads_f32(k), heads_f32(v), heads_f32(out),
                                    lse.data<float>(), ws.get());
  }
  if (q.dtype() == DType::f64) forward_typed<double>(q, k, v, causal, scale, rope, out, lse);
  else if (q.dtype() == DType::bf16) forward_typed<float, BFloat16>(q, k, v, causal, float(scale), rope, out, lse);
  else if (q.dtype() == DType::f16) forward_typed<float, Half>(q, k, v, causal, float(scale), rope, out, lse);
  else forward_typed<float>(q, k, v, causal, float(scale), rope, out, lse);
}

void attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, const AttentionRope& rope, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv) {
  if (attention_uses_tiles(q, v)) {
    const AttentionDims d = dims_of(q, k, v, causal, scale, rope, true);
    if (q.dtype() == DType::bf16 && bf16_gemm_native()) {
      const std::unique_ptr<char[]> ws = thread_scratch<char>(d.parallel, attention_workspace_avx512bf16(d, true));
      auto* backward = bgemm_kernel() == BgemmKernel::amx ? attention_backward_amx : attention_backward_avx512bf16;
      return backward(d, heads_bf16(grad), heads_bf16(q), heads_bf16(k), heads_bf16(v), heads_bf16(out),
                      lse.data<float>(), heads_bf16(dq), heads_bf16(dk), heads_bf16(dv), ws.get());
    }
    const bool bf16 = q.dtype() == DType::bf16;
    const std::unique_ptr<char[]> ws = thread_scratch<char>(d.parallel, attention_workspace_avx512(d, true, bf16));
    if (q.dtype() == DType::bf16)
      return attention_backward_avx512(d, heads_bf16(grad), heads_bf16(q), heads_bf16(k), heads_bf16(v),
                                       heads_bf16(out), lse.data<float>(), heads_bf16(dq), heads_bf16(dk),
                                       heads_bf16(dv), ws.get());
    return attention_backward_avx512(d, heads_f32(grad), heads_f32(q), heads_f32(k), heads_f32(v), heads_f32(out),
                                     lse.data<float>(), heads_f32(dq), heads_f32(dk), heads_f32(dv), ws.get());
  }
  if (q.dtype() == DType::f64)
    backward_typed<double>(grad, q, k, v, out, lse, causal, scale, rope, dq, dk, dv);
  else if (q.dtype() == DType::bf16)
    backward_typed<float, BFloat16>(grad, q, k, v, out, lse, causal, float(scale), rope, dq, dk, dv);
  else if (q.dtype() == DType::f16)
    backward_typed<float, Half>(grad, q, k, v, out, lse, causal, float(scale), rope, dq, dk, dv);
  else backward_typed<float>(grad, q, k, v, out, lse, causal, float(scale), rope, dq, dk, dv);
}

}  // namespace weft::kernels::cpu
