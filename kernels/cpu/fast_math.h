// kernels/cpu: float math written as plain arithmetic so that loops calling it vectorise
// (glibc's expf, tanhf, erff only vectorise under -ffast-math). Used by the element-wise
// kernels, softmax, log-sum-exp and cross-entropy, which spend their time in exp.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace weft::kernels::cpu {

// Relative errors are a few ulp, at most 4e-7 (measured against double over the whole f32 range). Forced inline: a call
// left in a loop body (GCC's size heuristics balk at these) stops vectorisation, and the selects then become
// unpredictable branches.
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

// sigmoid from e = exp(-|x|) <= 1, so neither side overflows and tiny results keep their precision.
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
// z^2; beyond, erfc(z) = exp(-z^2) * G(z), G a polynomial in z - 1.25 on [0.5, 2] and in 1/z^2 (over z) on [2, inf).
// Coefficients: least-squares fits on Chebyshev nodes, each within 3e-8 relative.
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

// Overloads for templated loops: f32 takes the vectorisable path, f64 libm.
WEFT_MATH_INLINE float fast_exp(float x) { return exp_f32(x); }
WEFT_MATH_INLINE double fast_exp(double x) { return std::exp(x); }

}  // namespace weft::kernels::cpu
