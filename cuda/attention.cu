// cuda/: fused scaled-dot-product attention in the flash-attention manner, forward and
// backward, behind kernels/attention.h. No [Tq, Tk] score matrix ever exists in global memory:
//
// Forward: a block owns `tile` query rows of one (batch, head). It walks the key tiles the
// rows may see (under the causal mask: up to its last row), loading each K and V tile into
// shared memory, and keeps per row the running max m, the running sum l of exp(s - m) and the
// unnormalised output O (an "online softmax"): for a new tile with scores S,
//   m' = max(m, max_j S_j);  P = exp(S - m');  l' = l e^(m - m') + sum_j P_j;
//   O' = O e^(m - m') + P V.
// At the end out = O / l and lse = m + log l is saved for the backward.
//
// Backward, with D_i = dO_i . O_i: P = exp(S - lse) is recomputed tile by tile, then
//   dV = P^T dO;  dP = dO V^T;  dS = P (dP - D) scale;  dK = dS^T Q;  dQ = dS K.
// One kernel owns a key tile (accumulating its dK, dV over the query tiles that see it), another
// a query tile (accumulating its dQ over key tiles): both recompute P, which costs a second pass
// but needs no atomics, so gradients are deterministic.
//
// Grouped-query attention: query head h reads key/value head h / G (G = H / Hkv); the dK, dV
// kernel owns a key tile of one key/value head and sums over the G query heads that read it.
// Rotary embeddings (kernels/rope.h) are applied to q and k rows as they are loaded into
// shared memory; dQ and dK are rotated back as they are stored.
//
// Everything is computed in the arithmetic type (f32 for bf16/f16, f64 for f64) from shared
// memory by plain loops: correct and simple, not tuned (no tensor cores). For 16-bit storage the
// operands of each product round to it where the CPU's bf16 kernels round them
// (kernels/cpu/attention_bf16_loops.h): rotated q and k once, P before O = P V and dV, dS
// before dQ and dK; the scores, softmax, lse and every sum stay f32.
#include "cuda/block_reduce.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

constexpr int kAttnThreads = 128;
constexpr int kMaxTile = 64;  // query rows per block in the forward: at most kAttnThreads

template <class T> struct View {
  T* p;
  int64_t sb, sh, st;
  __device__ T* row(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
};
template <class T> View<T> view_of(const HeadsView& v) { return {static_cast<T*>(v.data), v.sb, v.sh, v.st}; }

// x rounded to the storage type T and back: an operand of a product as 16-bit kernels see it.
template <class T, class A> __device__ A round_as(A x) { return load(store<T>(x)); }  // f32, f64: x

// dst[r * width + c] = src row (t0 + r), column c, for r < rows; as the arithmetic type.
template <class T, class A>
__device__ void load_rows(A* dst, const View<T>& src, int64_t b, int64_t h, int64_t t0, int rows, int64_t width) {
  for (int64_t idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int64_t r = idx / width, c = idx % width;
    dst[idx] = load(src.row(b, h, t0 + r)[c]);
  }
}

template <class T, class A>
__device__ void store_rows(const View<T>& dst, const A* src, int64_t b, int64_t h, int64_t t0, int rows,
                           int64_t width) {
  for (int64_t idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int64_t r = idx / width, c = idx % width;
    dst.row(b, h, t0 + r)[c] = store<T>(src[idx]);
  }
}

// load_rows rotating row t0 + r as position pos0 + t0 + r (s.rope_cos non-null).
template <class T, class A>
__device__ void load_rows_rotated(A* dst, const View<T>& src, int64_t b, int64_t h, int64_t t0, int rows,
                                  int64_t width, const AttentionShape& s, int64_t pos0) {
  if (!s.rope_cos) return load_rows(dst, src, b, h, t0, rows, width);
  const A *cos = static_cast<const A*>(s.rope_cos), *sin = static_cast<const A*>(s.rope_sin);
  const int64_t half = width / 2;
  for (int64_t idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int64_t r = idx / width, c = idx % width, i = c % half, t = pos0 + t0 + r;
    const T* row = src.row(b, h, t0 + r);
    const A x = load(row[c]), other = load(row[c < half ? c + half : c - half]);
    dst[idx] = round_as<T>(c < half ? x * cos[t * half + i] - other * sin[t * half + i]
                                    : x * cos[t * half + i] + other * sin[t * half + i]);
  }
}

// store_rows with the inverse rotation: the gradient of a rotated operand, back to the input's.
template <class T, class A>
__device__ void store_rows_rotated(const View<T>& dst, const A* src, int64_t b, int64_t h, int64_t t0, int rows,
                                   int64_t width, const AttentionShape& s, int64_t pos0) {
  if (!s.rope_cos) return store_rows(dst, src, b, h, t0, rows, width);
  const A *cos = static_cast<const A*>(s.rope_cos), *sin = static_cast<const A*>(s.rope_sin);
  const int64_t half = width / 2;
  for (int64_t idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
    const int64_t r = idx / width, c = idx % width, i = c % half, t = pos0 + t0 + r;
    const A x = src[idx], other = src[c < half ? idx + half : idx - half];
    const A y = c < half ? x * cos[t * half + i] + other * sin[t * half + i]
                         : x * cos[t * half + i] - other * sin[t * half + i];
    dst.row(b, h, t0 + r)[c] = store<T>(y);
  }
}

template <class A> __device__ void fill(A* p, int64_t n, A v) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}

template <class A> __device__ A dot(const A* a, const A* b, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// grid (B*H, query tiles). Shared: Q[tile][E], K[tile][E], V[tile][Ev], S[tile][tile],
// O[tile][Ev], m[tile], l[tile], alpha[tile].
template <class T>
__global__ void __launch_bounds__(kAttnThreads) attention_forward(View<T> q, View<T> k, View<T> v, View<T> out,
                                                                   acc_t<T>* __restrict__ lse, AttentionShape s,
                                                                   int tile) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* Ks = Qs + tile * s.E;
  A* Vs = Ks + tile * s.E;
  A* S = Vs + tile * s.Ev;
  A* Os = S + tile * tile;
  A* m = Os + tile * s.Ev;
  A* l = m + tile;
  A* alpha = l + tile;

  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H, hk = h / (s.H / s.Hkv);
  const int64_t i0 = int64_t(blockIdx.y) * tile;
  const int rows = int(min(int64_t(tile), s.Tq - i0));
  const A scale = A(s.scale);
  load_rows_rotated(Qs, q, b, h, i0, rows, s.E, s, s.q_pos);
  fill(Os, int64_t(tile) * s.Ev, A(0));
  if (threadIdx.x < tile) {
    m[threadIdx.x] = neg_inf<A>();
    l[threadIdx.x] = 0;
  }
  const int64_t key_end = s.causal ? min(s.Tk, i0 + rows) : s.Tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = int(min(int64_t(tile), s.Tk - j0));
    __syncthreads();  // the previous tile's K, V and S are no longer read
    load_rows_rotated(Ks, k, b, hk, j0, cols, s.E, s, s.k_pos);
    load_rows(Vs, v, b, hk, j0, cols, s.Ev);
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * tile; idx += blockDim.x) {
      const int r = idx / tile, j = idx % tile;
      const bool visible = j < cols && (!s.causal || j0 + j <= i0 + r);
      S[idx] = visible ? scale * dot(Qs + r * s.E, Ks + j * s.E, s.E) : neg_inf<A>();
    }
    __syncthreads();
    if (threadIdx.x < rows) {
      const int r = threadIdx.x;
      A* sr = S + r * tile;
      A mx = neg_inf<A>();
      for (int j = 0; j < tile; ++j) mx = MaxNanOp{}(mx, sr[j]);
      const A m_old = m[r], m_new = MaxNanOp{}(m_old, mx);
      if (m_new == neg_inf<A>()) {
        // Nothing visible yet in this row: keep O = 0, l = 0.
        for (int j = 0; j < tile; ++j) sr[j] = 0;
        alpha[r] = 1;
      } else {
        A sum = 0;
        for (int j = 0; j < tile; ++j) {
          const A p = exp_acc(sr[j] - m_new);  // masked entries: exp(-inf) = 0
          sr[j] = round_as<T>(p);  // as O = P V reads it; l sums p unrounded
          sum += p;
        }
        const A a = exp_acc(m_old - m_new);  // 0 on the first visible tile
        alpha[r] = a;
        l[r] = l[r] * a + sum;
        m[r] = m_new;
      }
    }
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < rows * s.Ev; idx += blockDim.x) {
      const int64_t r = idx / s.Ev, c = idx % s.Ev;
      const A* pr = S + r * tile;
      A acc = Os[idx] * alpha[r];
      for (int j = 0; j < cols; ++j) acc += pr[j] * Vs[j * s.Ev + c];
      Os[idx] = acc;
    }
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < rows * s.Ev; idx += blockDim.x) {
    const int64_t r = idx / s.Ev, c = idx % s.Ev;
    out.row(b, h, i0 + r)[c] = store<T>(Os[idx] / l[r]);
  }
  if (threadIdx.x < rows) lse[bh * s.Tq + i0 + threadIdx.x] = m[threadIdx.x] + log_acc(l[threadIdx.x]);
}

// delta[bh, i] = dO_i . O_i, one thread per query row.
template <class T>
__global__ void attention_delta(View<T> grad, View<T> out, acc_t<T>* __restrict__ delta, AttentionShape s) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, s.B * s.H * s.Tq) {
    const int64_t i = idx % s.Tq, bh = idx / s.Tq, b = bh / s.H, h = bh % s.H;
    const T *g = grad.row(b, h, i), *o = out.row(b, h, i);
    A sum = 0;
    for (int64_t c = 0; c < s.Ev; ++c) sum += load(g[c]) * load(o[c]);
    delta[idx] = sum;
  }
}

// P and dS of query rows [i0, i0+rows) against keys [j0, j0+cols) into P[tile][tile] and
// dS[tile][tile] (0 where masked or outside), from Q, dO, K, V tiles in shared memory.
template <class T, class A>
__device__ void recompute_tile(const A* Qs, const A* dOs, const A* Ks, const A* Vs, const A* L, const A* Dl,
                               int64_t i0, int rows, int64_t j0, int cols, int tile, const AttentionShape& s,
                               A* P, A* dS) {
  const A scale = A(s.scale);
  for (int idx = threadIdx.x; idx < tile * tile; idx += blockDim.x) {
    const int r = idx / tile, j = idx % tile;
    const bool visible = r < rows && j < cols && (!s.causal || j0 + j <= i0 + r);
    A p = 0, ds = 0;
    if (visible) {
      p = exp_acc(scale * dot(Qs + r * s.E, Ks + j * s.E, s.E) - L[r]);
      ds = p * (dot(dOs + r * s.Ev, Vs + j * s.Ev, s.Ev) - Dl[r]) * scale;
    }
    if (P) P[idx] = round_as<T>(p);
    dS[idx] = round_as<T>(ds);
  }
}

// grid (B*Hkv, key tiles). Shared: K[tile][E], V[tile][Ev], dK[tile][E], dV[tile][Ev],
// Q[tile][E], dO[tile][Ev], P[tile][tile], dS[tile][tile], L[tile], D[tile].
template <class T>
__global__ void __launch_bounds__(kAttnThreads) attention_backward_kv(View<T> grad, View<T> q, View<T> k,
                                                                       View<T> v, const acc_t<T>* __restrict__ lse,
                                                                       const acc_t<T>* __restrict__ delta,
                                                                       View<T> dk, View<T> dv, AttentionShape s,
                                                                       int tile) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* Ks = reinterpret_cast<A*>(smem_raw);
  A* Vs = Ks + tile * s.E;
  A* dKs = Vs + tile * s.Ev;
  A* dVs = dKs + tile * s.E;
  A* Qs = dVs + tile * s.Ev;
  A* dOs = Qs + tile * s.E;
  A* P = dOs + tile * s.Ev;
  A* dS = P + tile * tile;
  A* L = dS + tile * tile;
  A* Dl = L + tile;

  const int64_t b = blockIdx.x / s.Hkv, hk = blockIdx.x % s.Hkv, group = s.H / s.Hkv;
  const int64_t j0 = int64_t(blockIdx.y) * tile;
  const int cols = int(min(int64_t(tile), s.Tk - j0));
  load_rows_rotated(Ks, k, b, hk, j0, cols, s.E, s, s.k_pos);
  load_rows(Vs, v, b, hk, j0, cols, s.Ev);
  fill(dKs, int64_t(tile) * s.E, A(0));
  fill(dVs, int64_t(tile) * s.Ev, A(0));
  // Under the causal mask only queries i >= j0 see these keys (query and key tiles align).
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
  for (int64_t i0 = s.causal ? j0 : 0; i0 < s.Tq; i0 += tile) {
    const int64_t bh = b * s.H + h;
    const int rows = int(min(int64_t(tile), s.Tq - i0));
    __syncthreads();
    load_rows_rotated(Qs, q, b, h, i0, rows, s.E, s, s.q_pos);
    load_rows(dOs, grad, b, h, i0, rows, s.Ev);
    if (threadIdx.x < rows) {
      L[threadIdx.x] = lse[bh * s.Tq + i0 + threadIdx.x];
      Dl[threadIdx.x] = delta[bh * s.Tq + i0 + threadIdx.x];
    }
    __syncthreads();
    recompute_tile<T>(Qs, dOs, Ks, Vs, L, Dl, i0, rows, j0, cols, tile, s, P, dS);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < cols * s.Ev; idx += blockDim.x) {
      const int64_t j = idx / s.Ev, c = idx % s.Ev;
      A acc = dVs[idx];
      for (int r = 0; r < rows; ++r) acc += P[r * tile + j] * dOs[r * s.Ev + c];
      dVs[idx] = acc;
    }
    for (int64_t idx = threadIdx.x; idx < cols * s.E; idx += blockDim.x) {
      const int64_t j = idx / s.E, c = idx % s.E;
      A acc = dKs[idx];
      for (int r = 0; r < rows; ++r) acc += dS[r * tile + j] * Qs[r * s.E + c];
      dKs[idx] = acc;
    }
  }
  __syncthreads();
  store_rows_rotated(dk, dKs, b, hk, j0, cols, s.E, s, s.k_pos);
  store_rows(dv, dVs, b, hk, j0, cols, s.Ev);
}

// grid (B*H, query tiles). Shared: Q[tile][E], dO[tile][Ev], dQ[tile][E], K[tile][E],
// V[tile][Ev], dS[tile][tile], L[tile], D[tile].
template <class T>
__global__ void __launch_bounds__(kAttnThreads) attention_backward_q(View<T> grad, View<T> q, View<T> k, View<T> v,
                                                                      const acc_t<T>* __restrict__ lse,
                                                                      const acc_t<T>* __restrict__ delta,
                                                                      View<T> dq, AttentionShape s, int tile) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* Qs = reinterpret_cast<A*>(smem_raw);
  A* dOs = Qs + tile * s.E;
  A* dQs = dOs + tile * s.Ev;
  A* Ks = dQs + tile * s.E;
  A* Vs = Ks + tile * s.E;
  A* dS = Vs + tile * s.Ev;
  A* L = dS + tile * tile;
  A* Dl = L + tile;

  const int64_t bh = blockIdx.x, b = bh / s.H, h = bh % s.H, hk = h / (s.H / s.Hkv);
  const int64_t i0 = int64_t(blockIdx.y) * tile;
  const int rows = int(min(int64_t(tile), s.Tq - i0));
  load_rows_rotated(Qs, q, b, h, i0, rows, s.E, s, s.q_pos);
  load_rows(dOs, grad, b, h, i0, rows, s.Ev);
  fill(dQs, int64_t(tile) * s.E, A(0));
  if (threadIdx.x < rows) {
    L[threadIdx.x] = lse[bh * s.Tq + i0 + threadIdx.x];
    Dl[threadIdx.x] = delta[bh * s.Tq + i0 + threadIdx.x];
  }
  const int64_t key_end = s.causal ? min(s.Tk, i0 + rows) : s.Tk;
  for (int64_t j0 = 0; j0 < key_end; j0 += tile) {
    const int cols = int(min(int64_t(tile), s.Tk - j0));
    __syncthreads();
    load_rows_rotated(Ks, k, b, hk, j0, cols, s.E, s, s.k_pos);
    load_rows(Vs, v, b, hk, j0, cols, s.Ev);
    __syncthreads();
    recompute_tile<T, A>(Qs, dOs, Ks, Vs, L, Dl, i0, rows, j0, cols, tile, s, nullptr, dS);
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < rows * s.E; idx += blockDim.x) {
      const int64_t r = idx / s.E, c = idx % s.E;
      A acc = dQs[idx];
      for (int j = 0; j < cols; ++j) acc += dS[r * tile + j] * Ks[j * s.E + c];
      dQs[idx] = acc;
    }
  }
  __syncthreads();
  store_rows_rotated(dq, dQs, b, h, i0, rows, s.E, s, s.q_pos);
}

// Shared bytes of a kernel for `tile`: linear * tile + quadratic * tile^2 + 2 * tile values.
size_t smem_bytes(int tile, int64_t linear, int64_t quadratic, size_t elem) {
  return size_t(int64_t(tile) * linear + int64_t(tile) * tile * quadratic + 3 * tile) * elem;
}

// The largest tile (64, 32, 16 or 8) whose shared memory fits the 48 KiB every GPU grants
// without opting in; 8 otherwise, with the kernel opted in to what it needs (an error names
// the head dims if the GPU has less).
template <class K>
int pick_tile(K kernel, int64_t linear, int64_t quadratic, size_t elem, size_t* bytes) {
  constexpr size_t kDefaultSmem = 48 * 1024;
  int tile = kMaxTile;
  while (tile > 8 && smem_bytes(tile, linear, quadratic, elem) > kDefaultSmem) tile /= 2;
  *bytes = smem_bytes(tile, linear, quadratic, elem);
  if (*bytes > kDefaultSmem)
    WEFT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(*bytes)));
  return tile;
}

// heads: H, or Hkv for the kernel that owns key tiles.
dim3 attention_grid(const AttentionShape& s, int64_t heads, int64_t t, int tile) {
  const int64_t tiles = (t + tile - 1) / tile;
  if (s.B * heads > INT32_MAX || tiles > 65535)
    WEFT_CUDA_FAIL("attention: batch*heads or sequence length too large for the CUDA kernel's grid");
  return dim3(unsigned(s.B * heads), unsigned(tiles));
}

}  // namespace

void launch_attention(const HeadsView& q, const HeadsView& k, const HeadsView& v, const HeadsView& out, void* lse,
                      DType dtype, const AttentionShape& s, cudaStream_t stream) {
  if (s.B * s.H == 0 || s.Tq == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    size_t bytes = 0;
    auto kernel = attention_forward<T>;
    const int tile = pick_tile(kernel, 2 * s.E + 2 * s.Ev, 1, sizeof(A), &bytes);
    kernel<<<attention_grid(s, s.H, s.Tq, tile), kAttnThreads, bytes, stream>>>(
        view_of<T>(q), view_of<T>(k), view_of<T>(v), view_of<T>(out), static_cast<A*>(lse), s, tile);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_attention_backward(const HeadsView& grad, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                               const HeadsView& out, const void* lse, void* delta, const HeadsView& dq,
                               const HeadsView& dk, const HeadsView& dv, DType dtype, const AttentionShape& s,
                               cudaStream_t stream) {
  if (s.B * s.H == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    const A* L = static_cast<const A*>(lse);
    A* D = static_cast<A*>(delta);
    if (s.Tq > 0) {
      attention_delta<T><<<grid_for(s.B * s.H * s.Tq), kThreads, 0, stream>>>(view_of<T>(grad), view_of<T>(out),
                                                                                D, s);
      WEFT_CUDA_CHECK_LAUNCH();
    }
    if (s.Tk > 0) {
      size_t bytes = 0;
      auto kernel = attention_backward_kv<T>;
      const int tile = pick_tile(kernel, 3 * s.E + 3 * s.Ev, 2, sizeof(A), &bytes);
      kernel<<<attention_grid(s, s.Hkv, s.Tk, tile), kAttnThreads, bytes, stream>>>(
          view_of<T>(grad), view_of<T>(q), view_of<T>(k), view_of<T>(v), L, D, view_of<T>(dk), view_of<T>(dv), s,
          tile);
      WEFT_CUDA_CHECK_LAUNCH();
    }
    if (s.Tq > 0) {
      size_t bytes = 0;
      auto kernel = attention_backward_q<T>;
      const int tile = pick_tile(kernel, 3 * s.E + 2 * s.Ev, 1, sizeof(A), &bytes);
      kernel<<<attention_grid(s, s.H, s.Tq, tile), kAttnThreads, bytes, stream>>>(
          view_of<T>(grad), view_of<T>(q), view_of<T>(k), view_of<T>(v), L, D, view_of<T>(dq), s, tile);
      WEFT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace weft::kernels::cuda
