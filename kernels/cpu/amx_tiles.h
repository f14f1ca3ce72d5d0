// kernels/cpu: what the kernels on AMX tiles share (bgemm_amx.cpp, attention_amx.cpp): the
// tile configuration and the compiler barrier around tile instructions. TU-local (an anonymous
// namespace), for files built with -mamx-tile -mamx-bf16 -mavx512f.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace weft::kernels::cpu {
namespace {

// Palette 1 with all eight tiles 16 rows of 64 bytes, loaded before a thread's products.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The tile instructions are asm statements that do not tell the compiler which memory they
// read or write: this orders them against the packing before and the epilogue after.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

}  // namespace
}  // namespace weft::kernels::cpu
