// kernels/cpu: dropout. The keep decision for element i is a hash of (seed, i) — the
// splitmix64 output for counter i/2, one 32-bit half per element — so the mask is the same
// for a seed whatever the thread count, and threads need no shared generator state.
#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

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

void dropout(const Tensor& x, double p, uint64_t seed, const Tensor& y, const Tensor& mask) {
  int64_t n = x.numel();
  // Keep when the 32-bit draw is >= p * 2^32, so P(keep) = 1 - p up to 2^-32.
  uint64_t threshold = uint64_t(p * 4294967296.0);
  bool* pm = mask.data<bool>();
#pragma omp parallel for schedule(static) if (n > kParallelGrain)
  for (int64_t i = 0; i < n; i += 2) {
    uint64_t h = mix64(seed + uint64_t(i / 2 + 1) * 0x9e3779b97f4a7c15ull);
    pm[i] = (h & 0xffffffffull) >= threshold;
    if (i + 1 < n) pm[i + 1] = (h >> 32) >= threshold;
  }
  apply_mask(x, mask, p, y, "dropout");
}

void dropout_backward(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx) {
  apply_mask(grad, mask, p, dx, "dropout_backward");
}

}  // namespace weft::kernels::cpu
