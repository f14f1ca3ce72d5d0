// cuda/: softmax and log_softmax, forward and backward, over the middle dim of
// [outer, n, inner]. The last dim (inner == 1) gives one block per row: a block-wide max, a
// block-wide sum of exponentials, then the write, all in the arithmetic type (f32 for 16-bit
// inputs). Other dims give one thread per (outer, inner) column walking n; neighbouring
// threads read neighbouring addresses, so the loads still coalesce.
#include "cuda/block_reduce.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

template <class T, bool Log>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A mx = neg_inf<A>();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = MaxNanOp{}(mx, load(xr[i]));
    mx = block_max(mx, scratch);
    A sum = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += exp_acc(load(xr[i]) - mx);
    sum = block_sum(sum, scratch);
    if constexpr (Log) {
      // (x - max) - log(sum) keeps the low bits that x - lse would lose (as on the CPU).
      const A ls = log_acc(sum);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = store<T>((load(xr[i]) - mx) - ls);
    } else {
      const A inv = A(1) / sum;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = store<T>(exp_acc(load(xr[i]) - mx) * inv);
    }
  }
}

template <class T, bool Log>
__global__ void softmax_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                             int64_t inner) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(col, outer * inner) {
    const int64_t o = col / inner, j = col % inner;
    const T* xc = x + o * n * inner + j;
    T* yc = y + o * n * inner + j;
    A mx = neg_inf<A>(), sum = 0;
    for (int64_t i = 0; i < n; ++i) mx = MaxNanOp{}(mx, load(xc[i * inner]));
    for (int64_t i = 0; i < n; ++i) sum += exp_acc(load(xc[i * inner]) - mx);
    const A f = Log ? log_acc(sum) : A(1) / sum;
    for (int64_t i = 0; i < n; ++i) {
      const A v = load(xc[i * inner]) - mx;
      yc[i * inner] = store<T>(Log ? v - f : exp_acc(v) * f);
    }
  }
}

// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g).
template <class T, bool Log>
__global__ void softmax_backward_rows(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                      int64_t rows, int64_t n) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *gr = g + r * n, *yr = y + r * n;
    T* dr = dx + r * n;
    A s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += Log ? load(gr[i]) : load(gr[i]) * load(yr[i]);
    s = block_sum(s, scratch);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      if constexpr (Log) dr[i] = store<T>(load(gr[i]) - exp_acc(load(yr[i])) * s);
      else dr[i] = store<T>(load(yr[i]) * (load(gr[i]) - s));
    }
  }
}

template <class T, bool Log>
__global__ void softmax_backward_cols(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                      int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(col, outer * inner) {
    const int64_t off = (col / inner) * n * inner + col % inner;
    A s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = off + i * inner;
      s += Log ? load(g[at]) : load(g[at]) * load(y[at]);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = off + i * inner;
      if constexpr (Log) dx[at] = store<T>(load(g[at]) - exp_acc(load(y[at])) * s);
      else dx[at] = store<T>(load(y[at]) * (load(g[at]) - s));
    }
  }
}

template <class T, bool Log>
void forward(const void* x, void* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t stream) {
  const T* px = static_cast<const T*>(x);
  T* py = static_cast<T*>(y);
  if (inner == 1) softmax_rows<T, Log><<<row_blocks(outer), row_threads(n), 0, stream>>>(px, py, outer, n);
  else softmax_cols<T, Log><<<grid_for(outer * inner), kThreads, 0, stream>>>(px, py, outer, n, inner);
  WEFT_CUDA_CHECK_LAUNCH();
}

template <class T, bool Log>
void backward(const void* g, const void* y, void* dx, int64_t outer, int64_t n, int64_t inner,
              cudaStream_t stream) {
  const T *pg = static_cast<const T*>(g), *py = static_cast<const T*>(y);
  T* pd = static_cast<T*>(dx);
  if (inner == 1)
    softmax_backward_rows<T, Log><<<row_blocks(outer), row_threads(n), 0, stream>>>(pg, py, pd, outer, n);
  else
    softmax_backward_cols<T, Log><<<grid_for(outer * inner), kThreads, 0, stream>>>(pg, py, pd, outer, n, inner);
  WEFT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_softmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t stream) {
  if (outer * n * inner == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    if (log) forward<T, true>(x, y, outer, n, inner, stream);
    else forward<T, false>(x, y, outer, n, inner, stream);
  });
}

void launch_softmax_backward(const void* grad, const void* y, void* dx, DType dtype, int64_t outer, int64_t n,
                             int64_t inner, bool log, cudaStream_t stream) {
  if (outer * n * inner == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    if (log) backward<T, true>(grad, y, dx, outer, n, inner, stream);
    else backward<T, false>(grad, y, dx, outer, n, inner, stream);
  });
}

}  // namespace weft::kernels::cuda
