// cuda/: layer norm over rows of [rows, n], forward and backward, and RMS norm (mean
// null: nothing centred, no bias). One block per row
// computes the statistics two-pass (the mean, then the centred sums, corrected for the mean's
// rounding) in the arithmetic type, as the CPU does. The weight and bias gradients sum over rows: one block per 32
// columns with 8 row lanes, each lane summing every 8th row and the lanes combined in a fixed
// order, so the result is deterministic and needs no atomics.
#include "cuda/block_reduce.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

template <class T>
__global__ void layer_norm_forward(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                   acc_t<T> eps, int64_t rows, int64_t n, T* __restrict__ y,
                                   acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    T* yr = y + r * n;
    A s = 0;
    if (mean)
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += load(xr[i]);
    A mu = mean ? block_sum(s, scratch) / A(n) : A(0);
    A sq = 0, dev = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A d = load(xr[i]) - mu;
      sq += d * d;
      dev += d;
    }
    A total = block_sum(sq, scratch);
    const A dev_total = block_sum(dev, scratch);
    if (mean && !isinf(total)) {  // the first mean's rounding taken out, as on the CPU: equal values give 0
      total = fmax(A(0), total - dev_total * dev_total / A(n));
      mu += dev_total / A(n);
    }
    const A rs = isinf(total) ? A(NAN) : A(1) / sqrt_acc(total / A(n) + eps);  // past the type's range: NaN
    if (threadIdx.x == 0) {
      if (mean) mean[r] = mu;
      rstd[r] = rs;
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      A v = (load(xr[i]) - mu) * rs;
      if (w) v = v * load(w[i]);
      if (b) v = v + load(b[i]);
      yr[i] = store<T>(v);
    }
  }
}

// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)); RMS norm: mu = 0, no mean(g*w).
template <class T>
__global__ void layer_norm_backward_dx(const T* __restrict__ g, const T* __restrict__ x,
                                       const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                       const T* __restrict__ w, int64_t rows, int64_t n, T* __restrict__ dx) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *gr = g + r * n, *xr = x + r * n;
    T* dr = dx + r * n;
    const A mu = mean ? mean[r] : A(0), rs = rstd[r];
    A sg = 0, sgx = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A gw = load(gr[i]) * (w ? load(w[i]) : A(1));
      sg += gw;
      sgx += gw * (load(xr[i]) - mu) * rs;
    }
    sg = mean ? block_sum(sg, scratch) / A(n) : A(0);
    sgx = block_sum(sgx, scratch) / A(n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const A gw = load(gr[i]) * (w ? load(w[i]) : A(1));
      dr[i] = store<T>(rs * (gw - sg - (load(xr[i]) - mu) * rs * sgx));
    }
  }
}

constexpr int kColTile = 32, kRowLanes = 8;

// dweight[j] = sum_r g[r, j] * xhat[r, j]; dbias[j] = sum_r g[r, j]. Block (32, 8).
template <class T>
__global__ void layer_norm_backward_params(const T* __restrict__ g, const T* __restrict__ x,
                                           const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                                           int64_t rows, int64_t n, T* __restrict__ dw, T* __restrict__ db) {
  using A = acc_t<T>;
  __shared__ A part_w[kRowLanes][kColTile], part_b[kRowLanes][kColTile];
  const int64_t j = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  A sw = 0, sb = 0;
  if (j < n) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) {
      const A gv = load(g[r * n + j]);
      sb += gv;
      sw += gv * (load(x[r * n + j]) - (mean ? mean[r] : A(0))) * rstd[r];
    }
  }
  part_w[threadIdx.y][threadIdx.x] = sw;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    for (int lane = 1; lane < kRowLanes; ++lane) {
      sw += part_w[lane][threadIdx.x];
      sb += part_b[lane][threadIdx.x];
    }
    if (dw) dw[j] = store<T>(sw);
    if (db) db[j] = store<T>(sb);
  }
}

}  // namespace

void launch_layer_norm(const void* x, const void* weight, const void* bias, DType dtype, int64_t rows, int64_t n,
                       double eps, void* y, void* mean, void* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    layer_norm_forward<T><<<row_blocks(rows), row_threads(n), 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), A(eps), rows, n,
        static_cast<T*>(y), static_cast<A*>(mean), static_cast<A*>(rstd));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_layer_norm_backward(const void* grad, const void* x, const void* mean, const void* rstd,
                                const void* weight, DType dtype, int64_t rows, int64_t n, void* dx, void* dweight,
                                void* dbias, cudaStream_t stream) {
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    const T *pg = static_cast<const T*>(grad), *px = static_cast<const T*>(x);
    const A *pm = static_cast<const A*>(mean), *pr = static_cast<const A*>(rstd);
    if (rows > 0 && n > 0) {
      layer_norm_backward_dx<T><<<row_blocks(rows), row_threads(n), 0, stream>>>(
          pg, px, pm, pr, static_cast<const T*>(weight), rows, n, static_cast<T*>(dx));
      WEFT_CUDA_CHECK_LAUNCH();
    }
    if ((dweight || dbias) && n > 0) {
      // With no rows the sums are 0: the kernel still runs and writes them.
      const unsigned blocks = unsigned((n + kColTile - 1) / kColTile);
      layer_norm_backward_params<T><<<blocks, dim3(kColTile, kRowLanes), 0, stream>>>(
          pg, px, pm, pr, rows, n, static_cast<T*>(dweight), static_cast<T*>(dbias));
      WEFT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace weft::kernels::cuda
