// kernels/cpu: the packed-panel buffers of weft's GEMM kernels (sgemm_blocked.h, the bf16
// kernel; gemm.cpp's widened 16-bit blocks): grow-only, 64-byte aligned, one per thread and
// operand. TU-local (an anonymous namespace), as the ISA files that include it need.
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

}  // namespace
}  // namespace weft::kernels::cpu
