// kernels/cpu: the packed-panel buffers of weft's GEMM kernels (sgemm_blocked.h, the bf16 kernel; gemm.cpp's widened
// 16-bit blocks): grow-only, 64-byte aligned, one per thread and operand; the rule for when an operand must be packed;
// and bf16 bits widened to f32 and rounded back. TU-local (an anonymous namespace), as the ISA files that include it need.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <new>

namespace weft::kernels::cpu {
namespace {

template <typename T>
struct Scratch {
  static constexpr int64_t kUnit = 64 / int64_t(sizeof(T));  // elements per 64 bytes
  T* p = nullptr;
  int64_t n = 0;
  ~Scratch() { std::free(p); }
  T* get(int64_t want) {
    if (want <= n) return p;
    std::free(p);
    n = (want + kUnit - 1) / kUnit * kUnit;
    p = static_cast<T*>(std::aligned_alloc(64, size_t(n) * sizeof(T)));
    if (!p) throw std::bad_alloc();
    return p;
  }
};

// bf16 bits as the f32 they stand for.
inline float from_bf16(uint16_t h) { return __builtin_bit_cast(float, uint32_t(h) << 16); }
// f32 to bf16 bits, round to nearest even, NaN kept a (quiet) NaN: as core/half.h, with a select for NaN rather than
// a branch, so that loops converting to bf16 vectorise.
inline uint16_t to_bf16(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f), rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

// Whether rows `row_stride` elements of T apart fall in one set of the L1 (a multiple of 4 KiB:
// 64 sets of 64-byte lines). A register tile reading such rows in place would have its rows evict
// each other, so the GEMM kernels pack that operand instead (sgemm_blocked.h, the bf16 kernel).
template <typename T>
constexpr bool rows_share_l1_set(int64_t row_stride) { return row_stride * int64_t(sizeof(T)) % 4096 == 0; }

}  // namespace
}  // namespace weft::kernels::cpu
