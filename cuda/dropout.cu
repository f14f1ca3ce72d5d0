// cuda/: dropout. The keep decision of element i is the CPU's counter-based hash (the
// splitmix64 output for counter i/2 + 1 of a stream starting at the seed, one 32-bit half per
// element, kernels/cpu/dropout.cpp): no generator state on the device, any thread decides any
// element, and the mask for a seed is the same on CPU and CUDA.
#include "cuda/common.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One thread per pair of elements (one hash gives both draws).
template <class T>
__global__ void dropout_kernel(const T* __restrict__ x, int64_t n, uint64_t threshold, acc_t<T> scale,
                               uint64_t seed, T* __restrict__ y, bool* __restrict__ mask) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(pair, (n + 1) / 2) {
    const uint64_t h = mix64(seed + uint64_t(pair + 1) * 0x9e3779b97f4a7c15ull);
    const int64_t i = 2 * pair;
    const bool k0 = (h & 0xffffffffull) >= threshold;
    mask[i] = k0;
    y[i] = store<T>(load(x[i]) * (k0 ? scale : A(0)));
    if (i + 1 < n) {
      const bool k1 = (h >> 32) >= threshold;
      mask[i + 1] = k1;
      y[i + 1] = store<T>(load(x[i + 1]) * (k1 ? scale : A(0)));
    }
  }
}

template <class T>
__global__ void dropout_backward_kernel(const T* __restrict__ g, const bool* __restrict__ mask, int64_t n,
                                        acc_t<T> scale, T* __restrict__ dx) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) dx[i] = store<T>(load(g[i]) * (mask[i] ? scale : A(0)));
}

}  // namespace

void launch_dropout(const void* x, DType dtype, int64_t numel, double p, uint64_t seed, void* y, bool* mask,
                    cudaStream_t stream) {
  if (numel == 0) return;
  // Keep when the 32-bit draw is >= p * 2^32, as on the CPU.
  const uint64_t threshold = uint64_t(p * 4294967296.0);
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    const A scale = p < 1 ? A(1.0 / (1.0 - p)) : A(0);
    dropout_kernel<T><<<grid_for((numel + 1) / 2), kThreads, 0, stream>>>(
        static_cast<const T*>(x), numel, threshold, scale, seed, static_cast<T*>(y), mask);
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
