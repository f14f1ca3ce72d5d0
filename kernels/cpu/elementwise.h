// kernels/cpu: element-wise loops, plus the helpers CPU kernels share for splitting work
// over OpenMP threads, walking strided operands, and float math that vectorises.
// Callers (kernels/elementwise.cpp) have checked the arguments: every tensor is on the CPU,
// inputs are already broadcast to the output's shape (stride-0 views) and converted to
// the dtype the op computes in.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include "core/strided_iter.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace weft::kernels::cpu {

// Below this many elements a loop stays on one thread: an OpenMP fork costs microseconds.
inline constexpr int64_t kParallelGrain = 32768;

// How many pieces to split n items into so each gets at least min_per items.
inline int64_t num_chunks(int64_t n, int64_t min_per) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  int64_t k = std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(min_per, 1));
  return std::max<int64_t>(k, 1);
#else
  return 1;
#endif
}

// Runs fn(chunk, begin, end) for `chunks` contiguous pieces of [0, n), one per thread.
// Piece boundaries are multiples of 64 items so threads do not share cache lines.
template <class F>
void parallel_chunks(int64_t n, int64_t chunks, F&& fn) {
  if (chunks <= 1) {
    if (n > 0) fn(int64_t(0), int64_t(0), n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  step = (step + 63) / 64 * 64;
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = std::min(n, c * step), e = std::min(n, b + step);
    if (b < e) fn(c, b, e);
  }
}

// fn(begin, end) over [0, n), in parallel once each thread gets min_per items.
template <class F>
void parallel_range(int64_t n, int64_t min_per, F&& fn) {
  parallel_chunks(n, num_chunks(n, min_per), [&](int64_t, int64_t b, int64_t e) { fn(b, e); });
}

// Walks N operands of one shape (strides in elements) and calls
// fn(offsets, inner_strides, len) on runs of len elements. Operands that are all contiguous
// or all-broadcast (stride 0) form one flat run, split across threads when large; any
// other layout walks StridedIter runs, split by element ranges so that even one long run
// uses every thread.
template <size_t N, class F>
void for_each_run(const Shape& shape, const std::array<Shape, N>& strides, F&& fn) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::array<int64_t, N> flat{};
  bool all_flat = true;
  for (size_t k = 0; k < N; ++k) {
    bool contig = true, zero = true;
    int64_t expect = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] == 1) continue;
      contig &= strides[k][d] == expect;
      zero &= strides[k][d] == 0;
      expect *= shape[d];
    }
    flat[k] = contig ? 1 : 0;
    all_flat &= contig || zero;
  }
  if (all_flat) {
    parallel_range(n, kParallelGrain / 2, [&](int64_t b, int64_t e) {
      std::array<int64_t, N> off;
      for (size_t k = 0; k < N; ++k) off[k] = b * flat[k];
      fn(off, flat, e - b);
    });
    return;
  }
  StridedIter<N> it(shape, strides);
  int64_t inner = it.inner_size();
  const auto& st = it.inner_strides();
  parallel_range(n, kParallelGrain / 2, [&](int64_t b, int64_t e) {
    int64_t r = b / inner, i = b % inner;
    while (b < e) {
      auto off = it.run_offsets(r);
      int64_t len = std::min(inner - i, e - b);
      for (size_t k = 0; k < N; ++k) off[k] += i * st[k];
      fn(off, st, len);
      b += len;
      ++r;
      i = 0;
    }
  });
}

// ---- float math written as plain arithmetic so that loops calling it vectorise (libm calls
// do not without -ffast-math). Accuracy is within 2 ulp of the correctly rounded result.

// exp: x = n*ln2 + r with |r| <= ln2/2 and a polynomial for e^r; 2^n is applied in
// two halves so results down to the subnormal range stay exact.
inline float exp_f32(float x) {
  constexpr float kHi = 88.72283935546875f, kLo = -103.97f;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.f;
  int32_t ni = int32_t(n), e1 = ni >> 1, e2 = ni - e1;
  y = y * std::bit_cast<float>((e1 + 127) << 23) * std::bit_cast<float>((e2 + 127) << 23);
  y = x < kLo ? 0.f : y;
  return x > kHi ? std::numeric_limits<float>::infinity() : y;
}

// tanh: an odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), else via exp.
inline float tanh_f32(float x) {
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float small = x + x * z * p;
  float ax = std::fabs(x);
  float big = 1.f - 2.f / (exp_f32(2.f * ax) + 1.f);
  big = std::copysign(big, x);
  return ax < 0.625f ? small : big;
}

inline float sigmoid_f32(float x) { return 1.f / (1.f + exp_f32(-x)); }

// ---- the loops (arguments checked by the public entry points)
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void unary_backward(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
void add_(const Tensor& dst, const Tensor& src, double alpha);
void mul_scalar_(const Tensor& dst, double s);
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
void clamp(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi);

}  // namespace weft::kernels::cpu
