// kernels/cpu: an exp the compiler vectorises. glibc's expf only vectorises under
// -ffast-math, and softmax, log-sum-exp and cross-entropy spend their time in exp.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace weft::kernels::cpu {

// Branch-free exp for float (Cephes polynomial, about 2 ulp) for x <= 88, which covers
// every use here (arguments are x - max <= 0 or log-probabilities). Below -87 it returns
// exactly 0, so exp(-inf) == 0 for masked scores; NaN stays NaN.
inline float fast_exp(float x) {
  // Round x*log2(e) to an integer by adding 1.5*2^23 (std::floor would be a libm call here).
  float t = x * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln 2 split in two so r keeps its low bits
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23);  // 2^n
  return x < -87.0f ? 0.0f : e * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

}  // namespace weft::kernels::cpu
