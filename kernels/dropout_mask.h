// kernels: dropout's keep decision, written once for the CPU loop and the CUDA kernel (nvcc includes it). Element g
// (row-major) of a dropout's whole tensor is kept when its 32-bit draw, one half of the splitmix64 output for counter
// g/2 + 1 of a stream starting at the seed, is >= p * 2^32: the mask is a function of (seed, g) on any device and
// thread count, and a part of the whole (kernels::RandomBlock) decides each element by its index in the whole.
#pragma once
#include <cstdint>

#include "scalar_ops.h"  // WEFT_HOST_DEVICE

namespace weft::kernels {

// A tensor [outer, rows, inner] that is rows [start, start + rows) of a whole [outer, extent, inner].
struct DropoutIndex {
  int64_t rows = 1, inner = 1, extent = 1, start = 0;
  WEFT_HOST_DEVICE int64_t whole(int64_t i) const {  // element i's index in the whole
    if (rows == extent) return i;
    const int64_t row = i / inner;
    return ((row / rows) * extent + start + row % rows) * inner + i % inner;
  }
};

WEFT_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t threshold, int64_t g) {
  uint64_t z = seed + uint64_t(g / 2 + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (g % 2 ? z >> 32 : z & 0xffffffffull) >= threshold;
}

}  // namespace weft::kernels
