// kernels/cpu: layer norm over rows of [rows, n], and RMS norm (no mean: nothing centred, no bias). Statistics are
// two-pass (the mean, then the centred sums, corrected for the mean's rounding) in the accumulation type; rows go
// to threads. The backward keeps one dweight/dbias partial per chunk of rows and adds them in chunk order, so results
// do not depend on scheduling or on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                   const Tensor& mean, const Tensor& rstd) {
  using A = acc_t<T>;
  int64_t rows = rstd.numel(), n = rows ? x.numel() / rows : 0;
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const T* w = weight.defined() ? weight.data<T>() : nullptr;
  const T* b = bias.defined() ? bias.data<T>() : nullptr;
  A* pm = mean.defined() ? mean.data<A>() : nullptr;  // null: RMS norm
  A* pr = rstd.data<A>();
#pragma omp parallel for schedule(static) if (rows * n > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = px + r * n;
    T* yr = py + r * n;
    A sum = 0;
    if (pm) {
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < n; ++i) sum += A(xr[i]);
    }
    A mu = sum / A(n), sq = 0, dev = 0;
#pragma omp simd reduction(+ : sq, dev)
    for (int64_t i = 0; i < n; ++i) {
      const A d = A(xr[i]) - mu;
      sq += d * d, dev += d;
    }
    if (pm && !std::isinf(sq)) {  // the first mean's rounding taken out (Chan, Golub and LeVeque): a row of equal
      sq = std::max(A(0), sq - dev * dev / A(n));  // values has its value as mean, 0 as variance (an ulp off, with a
      mu += dev / A(n);                             // small eps such a row had normalised to +-1, not 0)
    }
    // a variance past the type's range is NaN, as PyTorch's (1 / sqrt(inf) made the row 0, silently)
    A rs = std::isinf(sq) ? std::numeric_limits<A>::quiet_NaN() : A(1) / std::sqrt(sq / A(n) + A(eps));
    if (pm) pm[r] = mu;
    pr[r] = rs;
    if (w && b) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store_as(yr[i], (A(xr[i]) - mu) * rs * A(w[i]) + A(b[i]));
    } else if (w) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store_as(yr[i], (A(xr[i]) - mu) * rs * A(w[i]));
    } else if (b) {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store_as(yr[i], (A(xr[i]) - mu) * rs + A(b[i]));
    } else {
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store_as(yr[i], (A(xr[i]) - mu) * rs);
    }
  }
}

// dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)); dweight = sum g*xhat; dbias = sum g.
// RMS norm (no mean): mu = 0 and no mean(g*w) term.
template <typename T>
void backward_typed(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                    const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  using A = acc_t<T>;
  int64_t rows = rstd.numel(), n = rows ? x.numel() / rows : 0;
  const T* pg = grad.data<T>();
  const T* px = x.data<T>();
  const T* w = weight.defined() ? weight.data<T>() : nullptr;
  const A* pm = mean.defined() ? mean.data<A>() : nullptr;
  const A* pr = rstd.data<A>();
  T* pdx = dx.data<T>();
  bool want_w = dweight.defined(), want_b = dbias.defined();
  // dweight/dbias partial sums per chunk of rows ([chunks][n] each, then added in chunk order);
  // the chunks depend on the shape alone, so the sums have the same bits on any thread count.
  int64_t chunks = rows * n > kParallelGrain ? reduction_chunks(rows, 1) : 1;
  int64_t step = (rows + chunks - 1) / chunks;
  std::vector<A> partial((want_w || want_b) ? size_t(2 * chunks * n) : 0, A(0));
#pragma omp parallel for schedule(static, 1) num_threads(int(num_chunks(chunks, 1))) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    A* pw = want_w ? partial.data() + c * n : nullptr;
    A* pb = want_b ? partial.data() + (chunks + c) * n : nullptr;
    for (int64_t r = c * step; r < std::min(rows, (c + 1) * step); ++r) {
      const T* gr = pg + r * n;
      const T* xr = px + r * n;
      T* dr = pdx + r * n;
      A mu = pm ? pm[r] : A(0), rs = pr[r], sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t i = 0; i < n; ++i) {
        A gw = A(gr[i]) * (w ? A(w[i]) : A(1));
        sg += gw;
        sgx += gw * (A(xr[i]) - mu) * rs;
      }
      sg = pm ? sg / A(n) : A(0);
      sgx /= A(n);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        A gw = A(gr[i]) * (w ? A(w[i]) : A(1));
        store_as(dr[i], rs * (gw - sg - (A(xr[i]) - mu) * rs * sgx));
      }
      if (pw) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) pw[i] += A(gr[i]) * (A(xr[i]) - mu) * rs;
      }
      if (pb) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) pb[i] += A(gr[i]);
      }
    }
  }
  auto finish = [&](const Tensor& out, int64_t first) {
    A* s = partial.data() + first * n;  // the first chunk's sums collect the others'
    for (int64_t c = 1; c < chunks; ++c)
      for (int64_t i = 0; i < n; ++i) s[i] += s[c * n + i];
    T* po = out.data<T>();
    for (int64_t i = 0; i < n; ++i) po[i] = T(s[i]);
  };
  if (want_w) finish(dweight, 0);
  if (want_b) finish(dbias, chunks);
}

}  // namespace

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                const Tensor& mean, const Tensor& rstd) {
  dispatch_float(x.dtype(), "layer_norm", [&]<typename T>() { forward_typed<T>(x, weight, bias, eps, y, mean, rstd); });
}

void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  dispatch_float(x.dtype(), "layer_norm_backward",
                 [&]<typename T>() { backward_typed<T>(grad, x, mean, rstd, weight, dx, dweight, dbias); });
}

}  // namespace weft::kernels::cpu
