// core: 16-bit floating types (bfloat16, IEEE half) stored as bits; arithmetic goes through
// float. Conversions from float round to nearest, ties to even, and keep NaN a NaN.
#pragma once
#include <cstdint>
#include <cstring>

namespace weft {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a float type
  operator float() const { return bits_float(uint32_t(bits) << 16); }
  // A select rather than a branch for NaN, so that loops converting to bf16 vectorise.
  static uint16_t from_float(float f) {
    const uint32_t u = float_bits(f), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);  // NaN: quiet
  }
};

struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow (and inf) -> inf
    if (a < 0x38800000u) {                                  // result is subnormal or zero
      // Add 0.5 (as float) so the FPU rounds the mantissa bits for us, ties to even.
      float v = bits_float(a) + 0.5f;
      return uint16_t(sign | (float_bits(v) - 0x3f000000u));
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return uint16_t(sign | (a >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      float v = float(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
      return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

}  // namespace weft
