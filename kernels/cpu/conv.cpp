// kernels/cpu: 2-D convolution as im2col + GEMM, per image. With at least as many images as threads, images go to
// threads (each with its own column buffer; gemm runs serially inside a parallel region); otherwise images run in turn
// and gemm threads each product. A 1x1, stride-1, unpadded convolution is a GEMM on the image itself, without im2col.
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

struct ConvGeom {
  int64_t n, c, h, w, o, kh, kw, ho, wo;
  Conv2dParams p;
  int64_t k() const { return c * kh * kw; }
  int64_t hw_out() const { return ho * wo; }
  int64_t image() const { return c * h * w; }
  bool direct() const {
    return kh == 1 && kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  }
};

ConvGeom geometry(const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  ConvGeom g{x.size(0),      x.size(1),      x.size(2), x.size(3), weight.size(0),
             weight.size(2), weight.size(3), 0,         0,         p};
  g.ho = (g.h + 2 * p.pad_h - g.kh) / p.stride_h + 1;
  g.wo = (g.w + 2 * p.pad_w - g.kw) / p.stride_w + 1;
  return g;
}

// Output columns ow whose input column ow*stride - pad + kj lies inside [0, w).
inline void valid_cols(const ConvGeom& g, int64_t kj, int64_t& lo, int64_t& hi) {
  int64_t s = g.p.stride_w, first = g.p.pad_w - kj, last = g.w - 1 + g.p.pad_w - kj;
  lo = first > 0 ? (first + s - 1) / s : 0;
  hi = last >= 0 ? std::min(g.wo, last / s + 1) : 0;
  lo = std::min(lo, g.wo);
  hi = std::max(hi, lo);
}

// col[(c*kh + ki)*kw + kj, oh*wo + ow] = x[c, oh*sh - ph + ki, ow*sw - pw + kj] (0 outside).
template <typename T>
void im2col(const ConvGeom& g, const T* x, T* col) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.hw_out();
        int64_t lo, hi;
        valid_cols(g, kj, lo, hi);
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          T* dst = row + oh * g.wo;
          int64_t ih = oh * g.p.stride_h - g.p.pad_h + ki;
          if (ih < 0 || ih >= g.h) {
            std::fill(dst, dst + g.wo, T(0));
            continue;
          }
          const T* src = x + (c * g.h + ih) * g.w - g.p.pad_w + kj;
          std::fill(dst, dst + lo, T(0));
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * g.p.stride_w];
          std::fill(dst + hi, dst + g.wo, T(0));
        }
      }
}

// The adjoint of im2col: dx[c, ih, iw] += col[...] (dx pre-zeroed).
template <typename T>
void col2im(const ConvGeom& g, const T* col, T* dx) {
  for (int64_t c = 0; c < g.c; ++c)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const T* row = col + ((c * g.kh + ki) * g.kw + kj) * g.hw_out();
        int64_t lo, hi;
        valid_cols(g, kj, lo, hi);
        for (int64_t oh = 0; oh < g.ho; ++oh) {
          int64_t ih = oh * g.p.stride_h - g.p.pad_h + ki;
          if (ih < 0 || ih >= g.h) continue;
          const T* src = row + oh * g.wo;
          T* dst = dx + (c * g.h + ih) * g.w - g.p.pad_w + kj;
          for (int64_t ow = lo; ow < hi; ++ow) dst[ow * g.p.stride_w] += src[ow];
        }
      }
}

// Whether images go to threads (true) or Eigen threads each image's GEMM (false).
bool split_images(const ConvGeom& g) {
  int nt = thread_count();
  return nt > 1 && g.n >= nt && double(g.n) * g.o * g.k() * g.hw_out() > 1e5;
}

// body(n, thread, group) for every image, in order within each of `groups` runs of images:
// the runs spread over `threads` threads, or all in turn (threads == 1) outside any parallel
// region so that gemm may thread each product itself.
template <class F>
void for_images(int64_t count, int64_t groups, int threads, F&& body) {
  auto run = [&](int64_t c, int tid) {
    for (int64_t n = count * c / groups; n < count * (c + 1) / groups; ++n) body(n, tid, c);
  };
  if (threads == 1) {
    for (int64_t c = 0; c < groups; ++c) run(c, 0);
    return;
  }
#pragma omp parallel for schedule(static, 1) num_threads(threads)
  for (int64_t c = 0; c < groups; ++c) run(c, thread_index());
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                   const Tensor& out) {
  ConvGeom g = geometry(x, weight, p);
  const T* px = x.data<T>();
  const T* pw = weight.data<T>();
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;
  T* po = out.data<T>();
  int64_t k = g.k(), hw = g.hw_out();
  int threads = split_images(g) ? thread_count() : 1;
  std::vector<std::vector<T>> cols(size_t(threads), std::vector<T>(g.direct() ? 0 : size_t(k * hw)));
  for_images(g.n, threads, threads, [&](int64_t n, int tid, int64_t) {
    const T* cn = px + n * g.image();
    if (!g.direct()) {
      im2col(g, cn, cols[tid].data());
      cn = cols[tid].data();
    }
    T* on = po + n * g.o * hw;
    gemm<T>(g.o, hw, k, pw, row_major(k), cn, row_major(hw), on, hw);
    if (pb)
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t i = 0; i < hw; ++i) on[o * hw + i] += pb[o];
  });
}

// dweight += g_n @ col_n^T, dcol_n = W^T @ g_n, dx_n = col2im(dcol_n), dbias = sum g.
template <typename T>
void backward_typed(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                    const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  ConvGeom g = geometry(x, weight, p);
  const T* pg = grad.data<T>();
  const T* px = x.data<T>();
  const T* pw = weight.data<T>();
  T* pdx = dx.data<T>();
  T* pdw = dweight.data<T>();
  int64_t k = g.k(), hw = g.hw_out(), wsize = g.o * k;
  int threads = split_images(g) ? thread_count() : 1;
  // One dweight partial per group of images, the groups fixed by the image count and added in
  // order afterwards: the same bits on any thread count.
  int64_t groups = reduction_chunks(g.n, 1);
  std::vector<T> partial(size_t(groups * wsize), T(0));
  size_t buf = g.direct() ? 0 : size_t(k * hw);
  auto cols = std::vector<std::vector<T>>(size_t(threads), std::vector<T>(buf)), dcols = cols;
  for_images(g.n, groups, threads, [&](int64_t n, int tid, int64_t group) {
    const T* cn = px + n * g.image();
    if (!g.direct()) {
      im2col(g, cn, cols[tid].data());
      cn = cols[tid].data();
    }
    const T* gn = pg + n * g.o * hw;
    gemm<T>(g.o, k, hw, gn, row_major(hw), cn, col_major(hw), partial.data() + group * wsize, k, T(1), T(1));
    T* dcn = g.direct() ? pdx + n * g.image() : dcols[tid].data();
    gemm<T>(k, hw, g.o, pw, col_major(k), gn, row_major(hw), dcn, hw);
    if (!g.direct()) col2im(g, dcn, pdx + n * g.image());
  });
  std::copy(partial.begin(), partial.begin() + wsize, pdw);
  for (int64_t c = 1; c < groups; ++c)
    for (int64_t i = 0; i < wsize; ++i) pdw[i] += partial[c * wsize + i];
  if (dbias.defined()) {
    T* pdb = dbias.data<T>();
    for (int64_t o = 0; o < g.o; ++o) {
      T s = 0;
      for (int64_t n = 0; n < g.n; ++n) {
        const T* gr = pg + (n * g.o + o) * hw;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < hw; ++i) s += gr[i];
      }
      pdb[o] = s;
    }
  }
}

}  // namespace

void conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
            const Tensor& out) {
  if (out.numel() == 0) return;
  dispatch_float(x.dtype(), "conv2d", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      forward_typed<T>(x, weight, bias, p, out);
    else WEFT_ERROR("conv2d: 16-bit inputs must be converted to f32 by the caller");
  });
}

void conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  dispatch_float(x.dtype(), "conv2d_backward", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>)
      backward_typed<T>(grad, x, weight, p, dx, dweight, dbias);
    else WEFT_ERROR("conv2d_backward: 16-bit inputs must be converted to f32 by the caller");
  });
}

}  // namespace weft::kernels::cpu
