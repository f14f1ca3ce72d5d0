// kernels/cpu: dropout. Element i's keep decision is dropout_keep of its index in the whole
// tensor (kernels/dropout_mask.h): a hash of (seed, index), so the mask is the same for a seed
// whatever the thread count, and threads need no shared generator state.
#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

// out = in * mask / (1 - p): the kept elements scaled, the others 0 (the forward and the backward alike).
void apply_mask(const Tensor& in, const Tensor& mask, double p, const Tensor& out, const char* op) {
  const int64_t n = in.numel();
  const bool* pm = mask.data<bool>();
  dispatch_float(in.dtype(), op, [&]<typename T>() {
    using A = acc_t<T>;
    const T* px = in.data<T>();
    T* py = out.data<T>();
    A scale = p < 1 ? A(1.0 / (1.0 - p)) : A(0);
#pragma omp parallel for simd schedule(static) if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) py[i] = T(A(px[i]) * (pm[i] ? scale : A(0)));
  });
}

}  // namespace

void dropout(const Tensor& x, double p, uint64_t seed, const DropoutIndex& at, const Tensor& y, const Tensor& mask) {
  const int64_t n = x.numel();
  const uint64_t threshold = uint64_t(p * 4294967296.0);  // P(keep) = 1 - p up to 2^-32
  bool* pm = mask.data<bool>();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) pm[i] = dropout_keep(seed, threshold, at.whole(i));
  apply_mask(x, mask, p, y, "dropout");
}

void dropout_backward(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx) {
  apply_mask(grad, mask, p, dx, "dropout_backward");
}

}  // namespace weft::kernels::cpu
