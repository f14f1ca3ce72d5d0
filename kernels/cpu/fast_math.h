// kernels/cpu: an exp the compiler vectorises. glibc's expf only vectorises under
// -ffast-math, and softmax, log-sum-exp and cross-entropy spend their time in exp.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace weft::kernels::cpu {

// Branch-free exp for float (Cephes polynomial, about 2 ulp). Below -87 it returns exactly 0
// (so exp(-inf) == 0 for masked scores), above 88 it saturates near 2^127; NaN stays NaN.
inline float fast_exp(float x) {
  float xc = std::min(std::max(x, -87.0f), 88.0f);
  float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;  // ln 2 split in two so r keeps its low bits
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * r * r + r + 1.0f;
  float scale = std::bit_cast<float>(int32_t((int32_t(n) + 127) << 23));
  return x < -87.0f ? 0.0f : e * scale;
}
inline double fast_exp(double x) { return std::exp(x); }

}  // namespace weft::kernels::cpu
