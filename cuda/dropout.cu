// cuda/: dropout. Element i's keep decision is the CPU's, dropout_keep of its index in the whole
// tensor (kernels/dropout_mask.h): no generator state on the device, any thread decides any
// element, and the mask for a seed is the same on CPU and CUDA.
#include "cuda/common.cuh"
#include "cuda/nn_launch.h"
#include "kernels/dropout_mask.h"

namespace weft::kernels::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(const T* __restrict__ x, int64_t n, uint64_t threshold, acc_t<T> scale,
                               uint64_t seed, DropoutIndex at, T* __restrict__ y, bool* __restrict__ mask) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) {
    const bool keep = dropout_keep(seed, threshold, at.whole(i));
    mask[i] = keep;
    y[i] = store<T>(load(x[i]) * (keep ? scale : A(0)));
  }
}

template <class T>
__global__ void dropout_backward_kernel(const T* __restrict__ g, const bool* __restrict__ mask, int64_t n,
                                        acc_t<T> scale, T* __restrict__ dx) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) dx[i] = store<T>(load(g[i]) * (mask[i] ? scale : A(0)));
}

}  // namespace

void launch_dropout(const void* x, DType dtype, int64_t numel, double p, uint64_t seed, const DropoutIndex& at, void* y,
                    bool* mask, cudaStream_t stream) {
  if (numel == 0) return;
  // Keep when the 32-bit draw is >= p * 2^32, as on the CPU.
  const uint64_t threshold = uint64_t(p * 4294967296.0);
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    const A scale = p < 1 ? A(1.0 / (1.0 - p)) : A(0);
    dropout_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(static_cast<const T*>(x), numel, threshold, scale, seed,
                                                                at, static_cast<T*>(y), mask);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_dropout_backward(const void* grad, const bool* mask, DType dtype, int64_t numel, double p, void* dx,
                             cudaStream_t stream) {
  if (numel == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    const A scale = p < 1 ? A(1.0 / (1.0 - p)) : A(0);
    dropout_backward_kernel<T><<<grid_for(numel), kThreads, 0, stream>>>(static_cast<const T*>(grad), mask, numel,
                                                                         scale, static_cast<T*>(dx));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace weft::kernels::cuda
