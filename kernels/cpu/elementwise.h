// kernels/cpu: element-wise loops, plus the helpers CPU kernels share for splitting work over OpenMP threads, walking
// strided operands, and float math that vectorises. Callers (kernels/elementwise.cpp) have checked the arguments: every
// tensor is on the CPU, inputs are already broadcast to the output's shape (stride-0 views) and converted to the dtype
// the op computes in.
#pragma once
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "core/dispatch.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/cpu/fast_math.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace weft::kernels::cpu {

// Below this many elements a loop stays on one thread: an OpenMP fork costs microseconds.
inline constexpr int64_t kParallelGrain = 32768;

// A tensor's elements as T (the caller has checked the dtype), and whether T computes in floats.
template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }
template <class T> constexpr bool is_float_v = std::is_floating_point_v<acc_t<T>>;

// out = T(v); a bf16 through its bits, which a `#pragma omp simd` loop vectorises (a BFloat16
// temporary there becomes a per-lane array, and the loop stays scalar).
template <class T, class A> inline void store_as(T& out, A v) {
  if constexpr (std::is_same_v<T, BFloat16>) out.bits = BFloat16::from_float(v);
  else out = T(v);
}

// How many pieces to split n items into so each gets at least min_per items.
inline int64_t num_chunks(int64_t n, int64_t min_per) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  int64_t k = std::min<int64_t>(omp_get_max_threads(), n / std::max<int64_t>(min_per, 1));
  return std::max<int64_t>(k, 1);
#else
  return 1;
#endif
}

// How many pieces to split n items into, each of at least min_per, where the pieces' partial results are combined: a
// function of n and min_per alone (not of the thread count, nor of being inside a parallel region), so that the
// rounding is the same on any number of threads. At most 16: a split reduction keeps up to 16 cores busy, for one
// partial result per piece to combine; only reductions with too few outputs to go to threads whole are split.
inline int64_t reduction_chunks(int64_t n, int64_t min_per) {
  return std::clamp<int64_t>(n / std::max<int64_t>(min_per, 1), 1, 16);
}

// Runs fn(chunk, begin, end) for `chunks` contiguous pieces of [0, n), dealt in turn to at
// most omp_get_max_threads() threads (one inside a parallel region). Piece sizes are
// multiples of `align` items (64 elements keeps threads off each other's cache lines).
template <class F>
void parallel_chunks(int64_t n, int64_t chunks, int64_t align, F&& fn) {
  if (chunks <= 1) {
    if (n > 0) fn(int64_t(0), int64_t(0), n);
    return;
  }
  int64_t step = (n + chunks - 1) / chunks;
  step = (step + align - 1) / align * align;
#pragma omp parallel for num_threads(int(num_chunks(chunks, 1))) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = std::min(n, c * step), e = std::min(n, b + step);
    if (b < e) fn(c, b, e);
  }
}

// fn(begin, end) over [0, n), in parallel once each thread gets min_per items.
template <class F>
void parallel_range(int64_t n, int64_t min_per, int64_t align, F&& fn) {
  parallel_chunks(n, num_chunks(n, min_per), align, [&](int64_t, int64_t b, int64_t e) { fn(b, e); });
}

// A non-owning reference to a callback on one run of elements: fn(offsets, inner_strides, len), offsets and strides per
// operand in elements. Type-erased so that the walking code below exists once per operand count instead of once per op
// and dtype; the indirect call happens per run, not per element.
template <size_t N>
class RunFn {
 public:
  using Offsets = std::array<int64_t, N>;
  // Refers to f, which must outlive the call it is passed to (a temporary lambda does).
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, RunFn>)
  RunFn(F&& f)  // NOLINT: implicit from any callable
      : ctx_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* c, const Offsets& off, const Offsets& st, int64_t n) {
          (*static_cast<std::remove_reference_t<F>*>(c))(off, st, n);
        }) {}
  void operator()(const Offsets& off, const Offsets& st, int64_t n) const { call_(ctx_, off, st, n); }

 private:
  void* ctx_;
  void (*call_)(void*, const Offsets&, const Offsets&, int64_t);
};

// Walks N operands of one shape (strides in elements), calling fn on runs of elements. Operands that are all contiguous
// or all-broadcast (stride 0) form one flat run, split across threads when large; other layouts walk StridedIter runs,
// split by element ranges so that even a single long run uses every thread. Instantiated for N = 1..4.
template <size_t N>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, RunFn<N> fn);

// ---- the loops (arguments checked by the public entry points)
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void unary_backward(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup);
void add_(const Tensor& dst, const Tensor& src, double alpha);
void mul_scalar_(const Tensor& dst, double s);
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
void clamp(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi);

}  // namespace weft::kernels::cpu
