// kernels/cpu: one attention row's softmax, shared by the generic attention loops (attention.cpp) and the AVX-512
// register-tiled ones (attention_avx512.cpp). Forced inline, like fast_math.h: a file built for one instruction set
// must not leave an out-of-line copy that the linker could hand to code built for another.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/fast_math.h"

namespace weft::kernels::cpu {

// Overwrites s[0, n) (scaled scores of one query row, keys from `valid` on masked) with the
// softmax probabilities; returns the row's log-sum-exp.
template <typename T>
WEFT_MATH_INLINE T softmax_row(T* s, int64_t valid, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < valid; ++j) mx = s[j] > mx ? s[j] : mx;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < valid; ++j) {
    T e = fast_exp(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  T inv = T(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < valid; ++j) s[j] *= inv;
  for (int64_t j = valid; j < n; ++j) s[j] = T(0);
  return mx + std::log(sum);
}

}  // namespace weft::kernels::cpu
