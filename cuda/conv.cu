// cuda/: the non-GEMM parts of 2-D convolution (im2col, its adjoint col2im, the bias)
// and max pooling. col2im gathers the contributions to each input element instead of
// scattering with atomics, so it is deterministic; the pooling backward only learns the
// winners' positions (its entry point has no window geometry), so it scatters atomically.
#include "cuda/block_reduce.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

template <class T>
__global__ void im2col_kernel(const T* __restrict__ x, ConvShape s, int64_t images, T* __restrict__ col) {
  const int64_t hw = s.ho * s.wo, k = s.c * s.kh * s.kw;
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, images * k * hw) {
    const int64_t pos = idx % hw, row = (idx / hw) % k, img = idx / (hw * k);
    const int64_t oh = pos / s.wo, ow = pos % s.wo;
    const int64_t kj = row % s.kw, ki = (row / s.kw) % s.kh, c = row / (s.kw * s.kh);
    const int64_t ih = oh * s.sh - s.ph + ki, iw = ow * s.sw - s.pw + kj;
    const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
    col[idx] = inside ? x[((img * s.c + c) * s.h + ih) * s.w + iw] : T(0);
  }
}

template <class T>
__global__ void col2im_kernel(const T* __restrict__ col, ConvShape s, int64_t images, T* __restrict__ dx) {
  const int64_t hw = s.ho * s.wo, k = s.c * s.kh * s.kw;
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, images * s.c * s.h * s.w) {
    const int64_t iw = idx % s.w, ih = (idx / s.w) % s.h, c = (idx / (s.w * s.h)) % s.c;
    const int64_t img = idx / (s.w * s.h * s.c);
    const T* ci = col + img * k * hw;
    T sum = 0;
    for (int64_t ki = 0; ki < s.kh; ++ki) {
      const int64_t th = ih + s.ph - ki;  // = oh * sh for the output row that reads (ih, ki)
      if (th < 0 || th % s.sh) continue;
      const int64_t oh = th / s.sh;
      if (oh >= s.ho) continue;
      for (int64_t kj = 0; kj < s.kw; ++kj) {
        const int64_t tw = iw + s.pw - kj;
        if (tw < 0 || tw % s.sw) continue;
        const int64_t ow = tw / s.sw;
        if (ow >= s.wo) continue;
        sum += ci[((c * s.kh + ki) * s.kw + kj) * hw + oh * s.wo + ow];
      }
    }
    dx[idx] = sum;
  }
}

template <class T>
__global__ void add_channel_bias_kernel(T* __restrict__ out, const T* __restrict__ bias, int64_t images,
                                        int64_t channels, int64_t plane) {
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, images * channels * plane) out[idx] += bias[(idx / plane) % channels];
}

// One block per channel.
template <class T>
__global__ void channel_sum_kernel(const T* __restrict__ g, T* __restrict__ out, int64_t images, int64_t channels,
                                   int64_t plane) {
  __shared__ T scratch[32];
  for (int64_t o = blockIdx.x; o < channels; o += gridDim.x) {
    T s = 0;
    for (int64_t i = threadIdx.x; i < images * plane; i += blockDim.x) {
      const int64_t img = i / plane, j = i % plane;
      s += g[(img * channels + o) * plane + j];
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) out[o] = s;
  }
}

struct PoolShape {
  int64_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw;
};

// Padding never wins (it acts as -inf); NaN does, as on the CPU.
template <class T>
__global__ void max_pool_kernel(const T* __restrict__ x, PoolShape s, T* __restrict__ out,
                                int64_t* __restrict__ indices) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, s.planes * s.ho * s.wo) {
    const int64_t ow = idx % s.wo, oh = (idx / s.wo) % s.ho, plane = idx / (s.wo * s.ho);
    int64_t h0 = oh * s.sh - s.ph, w0 = ow * s.sw - s.pw;
    const int64_t h1 = min(h0 + s.kh, s.h), w1 = min(w0 + s.kw, s.w);
    h0 = max(h0, int64_t(0));
    w0 = max(w0, int64_t(0));
    const T* xp = x + plane * s.h * s.w;
    A best = neg_inf<A>();
    int64_t at = h0 * s.w + w0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) {
        const A v = load(xp[ih * s.w + iw]);
        if (v > best || v != v) {
          best = v;
          at = ih * s.w + iw;
        }
      }
    out[idx] = store<T>(best);
    indices[idx] = at;
  }
}

// dx[plane][index] += grad, one thread per grad element, accumulating in D (f32 or f64).
template <class T, class D>
__global__ void max_pool_backward_kernel(const T* __restrict__ g, const int64_t* __restrict__ indices,
                                         int64_t planes, int64_t plane_in, int64_t plane_out, D* __restrict__ dx) {
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, planes * plane_out) {
    const int64_t at = indices[idx];
    if (at < 0 || at >= plane_in) continue;
    atomicAdd(dx + (idx / plane_out) * plane_in + at, D(load(g[idx])));
  }
}

template <class F> void dispatch_conv(DType t, F&& fn) {
  if (t == DType::f32) return fn.template operator()<float>();
  if (t == DType::f64) return fn.template operator()<double>();
  WEFT_CUDA_FAIL("conv2d: the CUDA kernels take f32 or f64 (16-bit is converted by the caller)");
}

}  // namespace

void launch_im2col(const void* x, DType dtype, const ConvShape& s, int64_t images, void* col, cudaStream_t stream) {
  const int64_t total = images * s.c * s.kh * s.kw * s.ho * s.wo;
  if (total == 0) return;
  dispatch_conv(dtype, [&]<class T>() {
    im2col_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), s, images,
                                                                static_cast<T*>(col));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_col2im(const void* col, DType dtype, const ConvShape& s, int64_t images, void* dx, cudaStream_t stream) {
  const int64_t total = images * s.c * s.h * s.w;
  if (total == 0) return;
  dispatch_conv(dtype, [&]<class T>() {
    col2im_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(col), s, images,
                                                                static_cast<T*>(dx));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_add_channel_bias(void* out, const void* bias, DType dtype, int64_t images, int64_t channels,
                             int64_t plane, cudaStream_t stream) {
  const int64_t total = images * channels * plane;
  if (total == 0) return;
  dispatch_conv(dtype, [&]<class T>() {
    add_channel_bias_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<T*>(out),
                                                                          static_cast<const T*>(bias), images,
                                                                          channels, plane);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_channel_sum(const void* grad, void* dbias, DType dtype, int64_t images, int64_t channels,
                        int64_t plane, cudaStream_t stream) {
  if (channels == 0) return;
  dispatch_conv(dtype, [&]<class T>() {
    channel_sum_kernel<T><<<row_blocks(channels), kThreads, 0, stream>>>(
        static_cast<const T*>(grad), static_cast<T*>(dbias), images, channels, plane);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_max_pool2d(const void* x, DType dtype, int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, void* out,
                       int64_t* indices, cudaStream_t stream) {
  const int64_t total = planes * ho * wo;
  if (total == 0) return;
  PoolShape s{planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw};
  dispatch_float(dtype, [&]<class T>() {
    max_pool_kernel<T><<<grid_for(total), kThreads, 0, stream>>>(static_cast<const T*>(x), s, static_cast<T*>(out),
                                                                  indices);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_max_pool2d_backward(const void* grad, const int64_t* indices, DType grad_dtype, int64_t planes,
                                int64_t plane_in, int64_t plane_out, void* dx, DType dx_dtype, cudaStream_t stream) {
  const int64_t total = planes * plane_out;
  if (total == 0) return;
  dispatch_float(grad_dtype, [&]<class T>() {
    dispatch_conv(dx_dtype, [&]<class D>() {
      if constexpr (std::is_same_v<acc_t<T>, D> || std::is_same_v<T, D>) {
        max_pool_backward_kernel<T, D><<<grid_for(total), kThreads, 0, stream>>>(
            static_cast<const T*>(grad), indices, planes, plane_in, plane_out, static_cast<D*>(dx));
        WEFT_CUDA_CHECK_LAUNCH();
      } else {
        WEFT_CUDA_FAIL("max_pool2d_backward: dx must be f32 for f32/bf16/f16 grads and f64 for f64");
      }
    });
  });
}

}  // namespace weft::kernels::cuda
