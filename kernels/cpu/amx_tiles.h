// kernels/cpu: what the kernels on AMX tiles share (bgemm_amx.cpp, attention_amx.cpp): the
// tile configuration, the compiler barrier around tile instructions, and the 16 x 16 transpose
// of 32-bit words that packs bf16 pairs into tile rows. TU-local (an anonymous namespace), for
// files built with -mamx-tile -mamx-bf16 -mavx512f.
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

// In place: row i of r[16] becomes column i (32-bit elements).
inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c], 128-bit lane L: column 4L + c of rows i..i+3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i x = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x44), y = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x44);
    const __m512i z = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xee), w = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xee);
    t[c] = _mm512_shuffle_i32x4(x, y, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x, y, 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(z, w, 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(z, w, 0xdd);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace
}  // namespace weft::kernels::cpu
