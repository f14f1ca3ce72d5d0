// kernels/cpu: softmax and log_softmax, forward and backward, over the middle dim of [outer, n, inner]. inner == 1 (the
// last dim) is the fast path: one row per task, three vectorised passes over a row that stays in cache. Other dims walk
// whole inner rows at a time so they need no transpose.
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

// Width of the column block a task handles when reducing over a non-last dim.
constexpr int64_t kColBlock = 256;

template <typename T, bool Log>
void softmax_row(const T* x, T* y, int64_t n, acc_t<T>* buf) {
  using A = acc_t<T>;
  A mx = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, A(x[i]));
  A sum = 0;
  if constexpr (Log) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += fast_exp(A(x[i]) - mx);
    A ls = std::log(sum);  // (x - max) - log(sum) keeps the low bits that x - lse would lose
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store_as(y[i], (A(x[i]) - mx) - ls);
  } else {
    // Exponentials go to y directly when it holds A, else to a float buffer (16-bit types).
    A* e = buf ? buf : reinterpret_cast<A*>(y);
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      e[i] = fast_exp(A(x[i]) - mx);
      sum += e[i];
    }
    A inv = A(1) / sum;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store_as(y[i], e[i] * inv);
  }
}

// Columns [j0, j1) of one [n, inner] slab.
template <typename T, bool Log>
void softmax_cols(const T* x, T* y, int64_t n, int64_t inner, int64_t j0, int64_t j1) {
  using A = acc_t<T>;
  A mx[kColBlock], sum[kColBlock];
  int64_t w = j1 - j0;
  for (int64_t j = 0; j < w; ++j) mx[j] = -std::numeric_limits<A>::infinity(), sum[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * inner + j0;
    for (int64_t j = 0; j < w; ++j) mx[j] = std::max(mx[j], A(xr[j]));
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * inner + j0;
    for (int64_t j = 0; j < w; ++j) sum[j] += fast_exp(A(xr[j]) - mx[j]);
  }
  for (int64_t j = 0; j < w; ++j) sum[j] = Log ? std::log(sum[j]) : A(1) / sum[j];
  for (int64_t i = 0; i < n; ++i) {
    const T* xr = x + i * inner + j0;
    T* yr = y + i * inner + j0;
    for (int64_t j = 0; j < w; ++j) {
      if constexpr (Log) yr[j] = T((A(xr[j]) - mx[j]) - sum[j]);
      else yr[j] = T(fast_exp(A(xr[j]) - mx[j]) * sum[j]);
    }
  }
}

template <typename T, bool Log>
void softmax_typed(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  using A = acc_t<T>;
  [[maybe_unused]] bool par = outer * n * inner > kParallelGrain;
  if (inner == 1) {
    constexpr bool need_buf = !std::is_same_v<T, A> && !Log;
#pragma omp parallel if (par)
    {
      std::vector<A> buf(need_buf ? n : 0);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < outer; ++r)
        softmax_row<T, Log>(x + r * n, y + r * n, n, need_buf ? buf.data() : nullptr);
    }
    return;
  }
  int64_t blocks = (inner + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < outer * blocks; ++t) {
    int64_t o = t / blocks, j0 = (t % blocks) * kColBlock;
    softmax_cols<T, Log>(x + o * n * inner, y + o * n * inner, n, inner, j0, std::min(inner, j0 + kColBlock));
  }
}

// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g).
template <typename T, bool Log>
void backward_row(const T* g, const T* y, T* dx, int64_t n) {
  using A = acc_t<T>;
  A s = 0;
  if constexpr (Log) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += A(g[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store_as(dx[i], A(g[i]) - fast_exp(A(y[i])) * s);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += A(g[i]) * A(y[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store_as(dx[i], A(y[i]) * (A(g[i]) - s));
  }
}

template <typename T, bool Log>
void backward_cols(const T* g, const T* y, T* dx, int64_t n, int64_t inner, int64_t j0, int64_t j1) {
  using A = acc_t<T>;
  A s[kColBlock];
  int64_t w = j1 - j0;
  for (int64_t j = 0; j < w; ++j) s[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* gr = g + i * inner + j0;
    const T* yr = y + i * inner + j0;
    for (int64_t j = 0; j < w; ++j) {
      if constexpr (Log) s[j] += A(gr[j]);
      else s[j] += A(gr[j]) * A(yr[j]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* gr = g + i * inner + j0;
    const T* yr = y + i * inner + j0;
    T* dr = dx + i * inner + j0;
    for (int64_t j = 0; j < w; ++j) {
      if constexpr (Log) dr[j] = T(A(gr[j]) - fast_exp(A(yr[j])) * s[j]);
      else dr[j] = T(A(yr[j]) * (A(gr[j]) - s[j]));
    }
  }
}

template <typename T, bool Log>
void backward_typed(const T* g, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner) {
  [[maybe_unused]] bool par = outer * n * inner > kParallelGrain;
  if (inner == 1) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < outer; ++r) backward_row<T, Log>(g + r * n, y + r * n, dx + r * n, n);
    return;
  }
  int64_t blocks = (inner + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t t = 0; t < outer * blocks; ++t) {
    int64_t o = t / blocks, j0 = (t % blocks) * kColBlock, off = o * n * inner;
    backward_cols<T, Log>(g + off, y + off, dx + off, n, inner, j0, std::min(inner, j0 + kColBlock));
  }
}

}  // namespace

void softmax(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&]<typename T>() {
    if (log) softmax_typed<T, true>(x.data<T>(), y.data<T>(), outer, n, inner);
    else softmax_typed<T, false>(x.data<T>(), y.data<T>(), outer, n, inner);
  });
}

void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                      int64_t inner, bool log) {
  if (y.numel() == 0) return;
  dispatch_float(y.dtype(), log ? "log_softmax_backward" : "softmax_backward", [&]<typename T>() {
    if (log) backward_typed<T, true>(grad.data<T>(), y.data<T>(), dx.data<T>(), outer, n, inner);
    else backward_typed<T, false>(grad.data<T>(), y.data<T>(), dx.data<T>(), outer, n, inner);
  });
}

}  // namespace weft::kernels::cpu
