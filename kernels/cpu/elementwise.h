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
#include <type_traits>

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
// Piece sizes are multiples of `align` items (64 elements keeps threads off each other's
// cache lines).
template <class F>
void parallel_chunks(int64_t n, int64_t chunks, int64_t align, F&& fn) {
  if (chunks <= 1) {
    if (n > 0) fn(int64_t(0), int64_t(0), n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  step = (step + align - 1) / align * align;
#pragma omp parallel for num_threads(int(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = std::min(n, c * step), e = std::min(n, b + step);
    if (b < e) fn(c, b, e);
  }
}

// fn(begin, end) over [0, n), in parallel once each thread gets min_per items.
template <class F>
void parallel_range(int64_t n, int64_t min_per, int64_t align, F&& fn) {
  parallel_chunks(n, num_chunks(n, min_per), align, [&](int64_t, int64_t b, int64_t e) { fn(b, e); });
}

// A non-owning reference to a callback on one run of elements: fn(offsets, inner_strides,
// len), offsets and strides per operand in elements. Type-erased so that the walking code
// below exists once per operand count instead of once per op and dtype; the indirect call
// happens per run, not per element.
template <size_t N>
class RunFn {
 public:
  using Offsets = std::array<int64_t, N>;
  // Refers to f, which must outlive the call it is passed to (a temporary lambda does).
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, RunFn>)
  RunFn(F&& f)  // NOLINT: implicit from any callable
      : ctx_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* c, const Offsets& off, const Offsets& st, int64_t n) {
          (*static_cast<std::remove_reference_t<F>*>(c))(off, st, n);
        }) {}
  void operator()(const Offsets& off, const Offsets& st, int64_t n) const { call_(ctx_, off, st, n); }

 private:
  void* ctx_;
  void (*call_)(void*, const Offsets&, const Offsets&, int64_t);
};

// Walks N operands of one shape (strides in elements), calling fn on runs of elements.
// Operands that are all contiguous or all-broadcast (stride 0) form one flat run, split
// across threads when large; other layouts walk StridedIter runs, split by element ranges
// so that even a single long run uses every thread. Instantiated for N = 1..4.
template <size_t N>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, RunFn<N> fn);

// ---- float math written as plain arithmetic so that loops calling it vectorise (libm calls
// do not without -ffast-math). Relative errors are a few ulp, at most 4e-7 (measured against
// double over the whole f32 range).
// Forced inline: a call left in a loop body (GCC's size heuristics balk at these) stops
// vectorisation, and the selects then become unpredictable branches.
#define WEFT_MATH_INLINE inline __attribute__((always_inline))

// exp: x = n*ln2 + r with |r| <= ln2/2 and a polynomial for e^r; 2^n is applied in
// two halves so results down to the subnormal range stay exact.
WEFT_MATH_INLINE float exp_f32(float x) {
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
WEFT_MATH_INLINE float tanh_f32(float x) {
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

// sigmoid from e = exp(-|x|) <= 1, so neither side overflows and tiny results keep their
// precision.
WEFT_MATH_INLINE float sigmoid_f32(float x) {
  float e = exp_f32(-std::fabs(x));
  float r = 1.f / (1.f + e);
  return x >= 0.f ? r : e * r;
}

// exp(-x^2 / 2) with x^2 split exactly (x*x plus its fma rounding error), so that the
// rounding of x^2 does not show up as a relative error of x^2 * 2^-24 in the result.
WEFT_MATH_INLINE float exp_neg_half_sq_f32(float x) {
  x = x < -20.f ? -20.f : x;  // beyond this the result is 0 in f32 anyway; keeps fma finite
  x = x > 20.f ? 20.f : x;
  float xx = x * x;
  float err = std::fma(x, x, -xx);
  return exp_f32(-0.5f * xx) * (1.f - 0.5f * err);
}

// The standard normal CDF, 0.5 * erfc(-x / sqrt2), with relative accuracy in the lower
// tail. With z = |x| / sqrt2: z < 0.5: 0.5 + 0.5 erf(x / sqrt2), erf(z)/z a polynomial in
// z^2; beyond, erfc(z) = exp(-z^2) * G(z), G a polynomial in z - 1.25 on [0.5, 2] and in
// 1/z^2 (over z) on [2, inf). Coefficients: least-squares fits on Chebyshev nodes, each
// within 3e-8 relative.
WEFT_MATH_INLINE float normal_cdf_f32(float x) {
  float ax = std::fabs(x);
  float z = ax * 0.70710678118654752f;
  float w = 0.5f * x * x;  // z^2
  float p = 7.84725912697e-5f;
  p = p * w - 8.00818932317e-4f;
  p = p * w + 5.1880988894e-3f;
  p = p * w - 2.68536910997e-2f;
  p = p * w + 1.1283582248e-1f;
  p = p * w - 3.76126255674e-1f;
  p = p * w + 1.12837916569f;
  float small = 0.5f + 0.5f * (x * 0.70710678118654752f) * p;

  float t = z - 1.25f;
  float g = -1.82168514003e-4f;
  g = g * t + 5.56369764034e-4f;
  g = g * t - 1.32159907606e-3f;
  g = g * t + 3.51200185273e-3f;
  g = g * t - 9.08050863451e-3f;
  g = g * t + 2.20195617682e-2f;
  g = g * t - 5.02186708798e-2f;
  g = g * t + 1.06795007917e-1f;
  g = g * t - 2.08821854026e-1f;
  g = g * t + 3.67822922538e-1f;
  float y = 1.f / (w > 4.f ? w : 4.f);  // 1/z^2 for z >= 2
  float q = -9.35402358561f;
  q = q * y + 1.19197724577e1f;
  q = q * y - 7.09606084841f;
  q = q * y + 2.84368707527f;
  q = q * y - 1.00715267964f;
  q = q * y + 4.21398840132e-1f;
  q = q * y - 2.82065244406e-1f;
  q = q * y + 5.64189407161e-1f;
  q = q / (z > 2.f ? z : 2.f);
  float half_erfc = 0.5f * exp_neg_half_sq_f32(x) * (z < 2.f ? g : q);
  float big = x > 0.f ? 1.f - half_erfc : half_erfc;
  return z < 0.5f ? small : big;
}

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
