// kernels/cpu: what the register-tiled attention loops share, f32 (attention_avx512.cpp) and bf16
// (attention_bf16_loops.h): the vector width, the row length of buffers with a column per key, the keys a causal row
// tile sees, a softmax row's numerators in whole vectors, and the carving of a thread's workspace. TU-local (an
// anonymous namespace): each includer is built for its own instruction set.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/attention_tiled.h"
#include "kernels/cpu/avx512_math.h"

namespace weft::kernels::cpu {
namespace {

constexpr int64_t kW = 16;  // f32 lanes per vector; bf16 pairs per vector

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
// The row length of the buffers with a column per key: whole vectors and one more, so that rows are not 4 KiB apart
// (one L1 set).
inline int64_t key_ld(int64_t Tk) { return round_up(Tk, kW) + kW; }
inline int64_t thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}
template <typename Hd>
auto* at(const Hd& x, int64_t b, int64_t h) { return x.p + b * x.sb + h * x.sh; }

// The keys that query rows [r0, r0 + rows) of the block at i0 attend to, of the block's n: under a causal mask those
// up to the last row's own position (query i sees keys 0..i), else all n.
inline int64_t keys_seen(bool causal, int64_t i0, int64_t r0, int64_t rows, int64_t n) {
  return causal ? std::min(n, i0 + r0 + rows) : n;
}

// Lanes j, j + 1, ..., j + 15 below `valid`.
inline __mmask16 lanes_below(int64_t valid, int64_t j) {
  const int64_t c = valid - j;
  return c >= kW ? __mmask16(0xffff) : c <= 0 ? __mmask16(0) : __mmask16((1u << c) - 1);
}

// The max of a row's scaled scores s[0, valid), valid >= 1.
inline float row_max(const float* s, int64_t valid) {
  __m512 mx = _mm512_set1_ps(-__builtin_inff());
  for (int64_t j = 0; j < valid; j += kW) mx = _mm512_mask_max_ps(mx, lanes_below(valid, j), mx, _mm512_loadu_ps(s + j));
  return _mm512_reduce_max_ps(mx);
}
// A softmax row's numerators e^(s[j] - top) for j < valid, in vectors of 16 handed to put(j, e) (lanes from `valid` on
// zero), then zero vectors on to n16; returns their sum, added in one order.
template <class Put>
float exp_row(const float* s, int64_t valid, int64_t n16, float top, Put put) {
  const __m512 t = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j < valid; j += kW) {
    const __m512 e = _mm512_maskz_mov_ps(lanes_below(valid, j), exp_x16(_mm512_sub_ps(_mm512_loadu_ps(s + j), t)));
    put(j, e);
    sum = _mm512_add_ps(sum, e);
  }
  for (; j < n16; j += kW) put(j, _mm512_setzero_ps());
  return _mm512_reduce_add_ps(sum);
}

// One thread's buffers, carved in order from its block of the workspace, each 64-byte aligned. With base == nullptr
// only `size` (bytes) is computed: the workspace query and the loops share one layout.
struct Carve {
  char* base;
  int64_t size = 0;
  template <typename T>
  T* take(int64_t n) {
    T* p = base ? reinterpret_cast<T*>(base + size) : nullptr;
    size += round_up(n * int64_t(sizeof(T)), 64);
    return p;
  }
};

}  // namespace
}  // namespace weft::kernels::cpu
