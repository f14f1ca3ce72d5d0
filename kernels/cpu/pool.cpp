// kernels/cpu: 2-D max pooling over independent planes (N*C of them), one plane per task.
// Padding never wins (it acts as -inf); NaN does, as in PyTorch.
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {

void max_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices) {
  int64_t planes = x.size(0), h = x.size(1), w = x.size(2), ho = out.size(1), wo = out.size(2);
  int64_t* pi = indices.data<int64_t>();
  dispatch_float(x.dtype(), "max_pool2d", [&]<typename T>() {
    using A = acc_t<T>;
    const T* px = x.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelGrain)
    for (int64_t c = 0; c < planes; ++c) {
      const T* xp = px + c * h * w;
      for (int64_t oh = 0; oh < ho; ++oh) {
        int64_t h0 = oh * p.stride_h - p.pad_h, h1 = std::min(h0 + p.kernel_h, h);
        h0 = std::max<int64_t>(h0, 0);
        for (int64_t ow = 0; ow < wo; ++ow) {
          int64_t w0 = ow * p.stride_w - p.pad_w, w1 = std::min(w0 + p.kernel_w, w);
          w0 = std::max<int64_t>(w0, 0);
          A best = -std::numeric_limits<A>::infinity();
          int64_t at = h0 * w + w0;
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) {
              A v = A(xp[ih * w + iw]);
              if (v > best || std::isnan(v)) {
                best = v;
                at = ih * w + iw;
              }
            }
          int64_t o = (c * ho + oh) * wo + ow;
          po[o] = T(best);
          pi[o] = at;
        }
      }
    }
  });
}

void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx) {
  int64_t planes = grad.size(0), per_out = grad.size(1) * grad.size(2), per_in = dx.size(1) * dx.size(2);
  // The loop writes at these positions unchecked.
  check_index_range(indices, per_in, "max_pool2d_backward", "positions in an input plane");
  const int64_t* pi = indices.data<int64_t>();
  dispatch_float(grad.dtype(), "max_pool2d_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T* pg = grad.data<T>();
    T* pd = dx.data<T>();
#pragma omp parallel for schedule(static) if (dx.numel() > kParallelGrain)
    for (int64_t c = 0; c < planes; ++c) {
      T* d = pd + c * per_in;
      for (int64_t i = 0; i < per_out; ++i) {
        int64_t at = pi[c * per_out + i];
        d[at] = T(A(d[at]) + A(pg[c * per_out + i]));
      }
    }
  });
}

}  // namespace weft::kernels::cpu
