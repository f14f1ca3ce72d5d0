// kernels/cpu: the element-wise loops. Each op is a small functor on the accumulation type (float for 16-bit floats)
// from kernels/scalar_ops.h, shared with the CUDA kernels; the op switch runs once per call and the loops are templated
// on the functor, with unit/zero inner strides fixed at compile time so they vectorise.
#include "kernels/cpu/elementwise.h"

#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/dispatch.h"
#include "core/strided_iter.h"
#include "kernels/scalar_ops.h"
#if defined(__AVX512F__)
#include "kernels/cpu/avx512_math.h"
#endif

namespace weft::kernels::cpu {

template <size_t N>
void for_each_run(const Shape& shape, const std::array<const Shape*, N>& strides, RunFn<N> fn) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::array<int64_t, N> flat{};
  bool all_flat = true;
  for (size_t k = 0; k < N; ++k) {
    bool contig = true, zero = true;
    int64_t expect = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      if (shape[d] == 1) continue;
      contig &= (*strides[k])[d] == expect;
      zero &= (*strides[k])[d] == 0;
      expect *= shape[d];
    }
    flat[k] = contig ? 1 : 0;
    all_flat &= contig || zero;
  }
  if (all_flat) {
    parallel_range(n, kParallelGrain / 2, 64, [&](int64_t b, int64_t e) {
      std::array<int64_t, N> off;
      for (size_t k = 0; k < N; ++k) off[k] = b * flat[k];
      fn(off, flat, e - b);
    });
    return;
  }
  std::array<Shape, N> all;
  for (size_t k = 0; k < N; ++k) all[k] = *strides[k];
  StridedIter<N> it(shape, all);
  int64_t inner = it.inner_size();
  const auto& st = it.inner_strides();
  parallel_range(n, kParallelGrain / 2, 64, [&](int64_t b, int64_t e) {
    int64_t r = b / inner, i = b % inner;
    while (b < e) {
      auto off = it.run_offsets(r);
      int64_t len = std::min(inner - i, e - b);
      for (size_t k = 0; k < N; ++k) off[k] += i * st[k];
      fn(off, st, len);
      b += len;
      ++r;
      i = 0;
    }
  });
}
template void for_each_run<1>(const Shape&, const std::array<const Shape*, 1>&, RunFn<1>);
template void for_each_run<2>(const Shape&, const std::array<const Shape*, 2>&, RunFn<2>);
template void for_each_run<3>(const Shape&, const std::array<const Shape*, 3>&, RunFn<3>);
template void for_each_run<4>(const Shape&, const std::array<const Shape*, 4>&, RunFn<4>);

namespace {
using namespace scalar;

// ---- loops; a stride template argument >= 0 replaces the runtime stride

template <int S0, int S1, class O, class A, class F>
void loop1(const F& f, O* o, const A* a, int64_t s0, int64_t s1, int64_t n) {
  if constexpr (S0 >= 0) s0 = S0;
  if constexpr (S1 >= 0) s1 = S1;
  for (int64_t i = 0; i < n; ++i) o[i * s0] = f(a[i * s1]);
}

template <int S0, int S1, int S2, class O, class A, class B, class F>
void loop2(const F& f, O* o, const A* a, const B* b, int64_t s0, int64_t s1, int64_t s2, int64_t n) {
  if constexpr (S0 >= 0) s0 = S0;
  if constexpr (S1 >= 0) s1 = S1;
  if constexpr (S2 >= 0) s2 = S2;
  for (int64_t i = 0; i < n; ++i) o[i * s0] = f(a[i * s1], b[i * s2]);
}

// In place loops read and write through one pointer, so no aliasing check blocks vectorising.
template <int S0, class T, class F>
void loop_inplace1(const F& f, T* d, int64_t s0, int64_t n) {
  if constexpr (S0 >= 0) s0 = S0;
  for (int64_t i = 0; i < n; ++i) d[i * s0] = f(d[i * s0]);
}

template <int S0, int S1, class T, class B, class F>
void loop_inplace2(const F& f, T* d, const B* b, int64_t s0, int64_t s1, int64_t n) {
  if constexpr (S0 >= 0) s0 = S0;
  if constexpr (S1 >= 0) s1 = S1;
  for (int64_t i = 0; i < n; ++i) d[i * s0] = f(d[i * s0], b[i * s1]);
}

// out = f(a)
template <class O, class A, class F>
void map1(const F& f, const Tensor& out, const Tensor& a) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  for_each_run<2>(out.shape(), {&out.strides(), &a.strides()}, [&](const auto& off, const auto& st, int64_t n) {
    if (st[0] == 1 && st[1] == 1) loop1<1, 1>(f, po + off[0], pa + off[1], 1, 1, n);
    else loop1<-1, -1>(f, po + off[0], pa + off[1], st[0], st[1], n);
  });
}

// out = f(a, b). kBroadcast: extra loops for one operand broadcast along the run (a row
// added to a matrix), worth their compile time for binary ops on 32/64-bit types.
template <class O, class A, class B, bool kBroadcast = false, class F>
void map2(const F& f, const Tensor& out, const Tensor& a, const Tensor& b) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  const B* pb = ptr<const B>(b);
  for_each_run<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                  [&](const auto& off, const auto& st, int64_t n) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    constexpr bool kWide = kBroadcast && sizeof(A) >= 4 && sizeof(B) >= 4;
    if (st[0] == 1 && st[1] == 1 && st[2] == 1) loop2<1, 1, 1>(f, o, x, y, 1, 1, 1, n);
    else if (kWide && st[0] == 1 && st[1] == 1 && st[2] == 0) loop2<1, 1, 0>(f, o, x, y, 1, 1, 0, n);
    else if (kWide && st[0] == 1 && st[1] == 0 && st[2] == 1) loop2<1, 0, 1>(f, o, x, y, 1, 0, 1, n);
    else loop2<-1, -1, -1>(f, o, x, y, st[0], st[1], st[2], n);
  });
}

// out = f(a, b, c); used by where, whose operands are rarely all unit-stride except the plain case.
template <class O, class A, class B, class C, class F>
void map3(const F& f, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c) {
  O* po = ptr<O>(out);
  const A* pa = ptr<const A>(a);
  const B* pb = ptr<const B>(b);
  const C* pc = ptr<const C>(c);
  for_each_run<4>(out.shape(), {&out.strides(), &a.strides(), &b.strides(), &c.strides()},
                  [&](const auto& off, const auto& st, int64_t n) {
    O* o = po + off[0];
    const A* x = pa + off[1];
    const B* y = pb + off[2];
    const C* z = pc + off[3];
    if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i], z[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * st[0]] = f(x[i * st[1]], y[i * st[2]], z[i * st[3]]);
    }
  });
}

// d = f(d)
template <class T, class F>
void inplace1(const F& f, const Tensor& dst) {
  T* pd = ptr<T>(dst);
  for_each_run<1>(dst.shape(), {&dst.strides()}, [&](const auto& off, const auto& st, int64_t n) {
    if (st[0] == 1) loop_inplace1<1>(f, pd + off[0], 1, n);
    else loop_inplace1<-1>(f, pd + off[0], st[0], n);
  });
}

// d = f(d, b)
template <class T, class B, class F>
void inplace2(const F& f, const Tensor& dst, const Tensor& b) {
  T* pd = ptr<T>(dst);
  const B* pb = ptr<const B>(b);
  for_each_run<2>(dst.shape(), {&dst.strides(), &b.strides()}, [&](const auto& off, const auto& st, int64_t n) {
    if (st[0] == 1 && st[1] == 1) loop_inplace2<1, 1>(f, pd + off[0], pb + off[1], 1, 1, n);
    else if (st[0] == 1 && st[1] == 0) loop_inplace2<1, 0>(f, pd + off[0], pb + off[1], 1, 0, n);
    else loop_inplace2<-1, -1>(f, pd + off[0], pb + off[1], st[0], st[1], n);
  });
}

// ---- bf16 in vector loops. The per-element loops above call the op on BFloat16 values, and did not vectorise: bf16
// add ran at 3.2 G elements/s where f32 ran at memory speed. The _acc maps below take g on the accumulation type (float
// for bf16) and, on unit-stride bf16 runs, widen, apply g and round in one loop that vectorises: the same bits (2,048 x
// 1,024 add on one Xeon core: 0.65 -> 0.45 ms). In-place operands (out == a) are read before written.

// o = g(a) or g(a, b) on one unit-stride run.
template <class G>
void wide_run(const G& g, BFloat16* o, const BFloat16* a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = BFloat16(g(float(a[j])));
}
template <class G>
void wide_run(const G& g, BFloat16* o, const BFloat16* a, const BFloat16* b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = BFloat16(g(float(a[j]), float(b[j])));
}

template <class O, class T>
constexpr bool kWide = std::is_same_v<T, BFloat16> && std::is_same_v<O, BFloat16>;

// out = O(g(A(a)))
template <class O, class T, class G>
void map1_acc(const G& g, const Tensor& out, const Tensor& a) {
  using A = acc_t<T>;
  if constexpr (kWide<O, T>) {
    O* po = ptr<O>(out);
    const T* pa = ptr<const T>(a);
    for_each_run<2>(out.shape(), {&out.strides(), &a.strides()}, [&](const auto& off, const auto& st, int64_t n) {
      if (st[0] == 1 && st[1] == 1) return wide_run(g, po + off[0], pa + off[1], n);
      for (int64_t i = 0; i < n; ++i) po[off[0] + i * st[0]] = O(g(A(pa[off[1] + i * st[1]])));
    });
  } else {
    map1<O, T>([&g](T x) { return O(g(A(x))); }, out, a);
  }
}

// out = O(g(A(a), A(b)))
template <class O, class T, bool kBroadcast = false, class G>
void map2_acc(const G& g, const Tensor& out, const Tensor& a, const Tensor& b) {
  using A = acc_t<T>;
  if constexpr (kWide<O, T>) {
    O* po = ptr<O>(out);
    const T *pa = ptr<const T>(a), *pb = ptr<const T>(b);
    for_each_run<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()},
                    [&](const auto& off, const auto& st, int64_t n) {
      if (st[0] == 1 && st[1] == 1 && st[2] == 1) return wide_run(g, po + off[0], pa + off[1], pb + off[2], n);
      for (int64_t i = 0; i < n; ++i)
        po[off[0] + i * st[0]] = O(g(A(pa[off[1] + i * st[1]]), A(pb[off[2] + i * st[2]])));
    });
  } else {
    map2<O, T, T, kBroadcast>([&g](T x, T y) { return O(g(A(x), A(y))); }, out, a, b);
  }
}

// d = T(g(A(d))), d = T(g(A(d), A(b)))
template <class T, class G>
void inplace1_acc(const G& g, const Tensor& dst) {
  using A = acc_t<T>;
  if constexpr (kWide<T, T>) map1_acc<T, T>(g, dst, dst);
  else inplace1<T>([&g](T d) { return T(g(A(d))); }, dst);
}
template <class T, class G>
void inplace2_acc(const G& g, const Tensor& dst, const Tensor& b) {
  using A = acc_t<T>;
  if constexpr (kWide<T, T>) map2_acc<T, T>(g, dst, dst, b);
  else inplace2<T, T>([&g](T d, T y) { return T(g(A(d), A(y))); }, dst, b);
}

// ---- math: the shared formulas (kernels/scalar_ops.h) with float exp, tanh, sigmoid and
// the normal distribution written so that loops calling them vectorise (fast_math.h).

struct CpuMath : LibMath {
  using LibMath::exp;
  using LibMath::normal_cdf;
  using LibMath::normal_pdf;
  using LibMath::sigmoid;
  using LibMath::tanh;
  WEFT_MATH_INLINE static float exp(float x) { return exp_f32(x); }
  WEFT_MATH_INLINE static float tanh(float x) { return tanh_f32(x); }
  WEFT_MATH_INLINE static float sigmoid(float x) { return sigmoid_f32(x); }
  WEFT_MATH_INLINE static float normal_cdf(float x) { return normal_cdf_f32(x); }
  WEFT_MATH_INLINE static float normal_pdf(float x) { return float(kInvSqrt2Pi) * exp_neg_half_sq_f32(x); }
};

// sqrt with explicit vector instructions on unit-stride runs: std::sqrt in a loop does not
// vectorise while it may have to set errno (no -fno-math-errno here).
template <class T>
void sqrt_run(const T* a, T* o, int64_t n, bool reciprocal) {
  int64_t i = 0;
#if defined(__AVX__)  // 256-bit: AVX-512's sqrt intrinsics trip a GCC 12 false warning
  if constexpr (std::is_same_v<T, float>) {
    const __m256 one = _mm256_set1_ps(1.f);
    for (; i + 8 <= n; i += 8) {
      __m256 r = _mm256_sqrt_ps(_mm256_loadu_ps(a + i));
      _mm256_storeu_ps(o + i, reciprocal ? _mm256_div_ps(one, r) : r);
    }
  } else {
    const __m256d one = _mm256_set1_pd(1.0);
    for (; i + 4 <= n; i += 4) {
      __m256d r = _mm256_sqrt_pd(_mm256_loadu_pd(a + i));
      _mm256_storeu_pd(o + i, reciprocal ? _mm256_div_pd(one, r) : r);
    }
  }
#endif
  for (; i < n; ++i) o[i] = reciprocal ? T(1) / std::sqrt(a[i]) : std::sqrt(a[i]);
}

template <class T>
void sqrt_map(bool reciprocal, const Tensor& out, const Tensor& x) {
  T* po = ptr<T>(out);
  const T* px = ptr<const T>(x);
  for_each_run<2>(out.shape(), {&out.strides(), &x.strides()}, [&](const auto& off, const auto& st, int64_t n) {
    if (st[0] == 1 && st[1] == 1) return sqrt_run(px + off[1], po + off[0], n, reciprocal);
    for (int64_t i = 0; i < n; ++i) {
      T r = std::sqrt(px[off[1] + i * st[1]]);
      po[off[0] + i * st[0]] = reciprocal ? T(1) / r : r;
    }
  });
}

// ---- gelu_tanh on bf16 (the MLP activation of mixed-precision GPT training) in 16-lane AVX-512 on unit-stride
// operands, forward and backward: scalar_ops.h's formulas with fast_math.h's exp in f32, rounded once to bf16 (within
// 2^-14 of the generic loop). The generic loop compiles exp's and sigmoid's range checks into masked code; this one
// takes the exponent by vscalefps (0 below the range), the forward as x sigmoid(2u), and rounds by vcvtneps2bf16 where
// the CPU has AVX512_BF16: 2,048 x 2,048 on a Zen 4 in 1.8 ms instead of 3.8 forward, 2.8 instead of 4.4 backward,
// bound by the 512-bit FP pipes. One exponential and one approximate reciprocal per element, forward and backward.
#if defined(__AVX512F__) && defined(__AVX512BW__)
// sigmoid(v) from e = e^-|v| in (0, 1]: 1 / (1 + e), or e / (1 + e) for v < 0, the reciprocal by vrcp14ps (within
// 2^-14, far inside bf16's 2^-9).
WEFT_MATH_INLINE __m512 sigmoid_x16(__m512 v) {
  const __m512 e = exp_x16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(v)));
  const __m512 r = _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.f), e));
  return _mm512_mask_mul_ps(r, _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ), e, r);
}
template <bool Backward>
void gelu_bf16_run(const BFloat16* x, const BFloat16* g, BFloat16* o, int64_t n) {
  const __m512 c0 = _mm512_set1_ps(float(kSqrt2OverPi)), one = _mm512_set1_ps(1.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load_bf16x16(x + i), vv = _mm512_mul_ps(v, v);
    const __m512 u = _mm512_mul_ps(c0, _mm512_fmadd_ps(_mm512_set1_ps(float(kGeluC)), _mm512_mul_ps(vv, v), v));
    const __m512 sg = sigmoid_x16(_mm512_add_ps(u, u));  // gelu = x sigmoid(2u)
    if constexpr (!Backward) { store_bf16x16(o + i, _mm512_mul_ps(v, sg)); continue; }
    const __m512 du = _mm512_mul_ps(c0, _mm512_fmadd_ps(_mm512_set1_ps(float(3 * kGeluC)), vv, one));
    const __m512 two_x_s = _mm512_mul_ps(_mm512_add_ps(v, v), sg);
    const __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(two_x_s, _mm512_sub_ps(one, sg)), du, sg);
    store_bf16x16(o + i, _mm512_mul_ps(load_bf16x16(g + i), d));
  }
  for (; i < n; ++i)
    o[i] = Backward ? BFloat16(float(g[i]) * gelu_tanh_grad<CpuMath>(float(x[i])))
                    : BFloat16(gelu_tanh<CpuMath>(float(x[i])));
}

// ---- silu(a) * b and silu'(a) * b on bf16 (SwiGLU's gate in mixed-precision Llama training) in 16-lane AVX-512 on
// unit-stride operands of one shape, as the GELU loop above: sigmoid from one exponential of -|a| and an approximate
// reciprocal, rounded once to bf16 (within 2^-14 of the generic loop before that rounding). 2,048 x 1,024 on one Xeon
// core: 1.7 ms by the generic loop, division-bound; 0.8 ms by this one.
// silu'(v) = s + v s (1 - s) = s (1 + v (1 - s))
WEFT_MATH_INLINE __m512 silu_grad_x16(__m512 v, __m512 s) {
  const __m512 one = _mm512_set1_ps(1.f);
  return _mm512_mul_ps(s, _mm512_fmadd_ps(v, _mm512_sub_ps(one, s), one));
}
template <bool Grad>
void silu_mul_bf16_run(const BFloat16* a, const BFloat16* b, BFloat16* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load_bf16x16(a + i), s = sigmoid_x16(v);
    store_bf16x16(o + i, _mm512_mul_ps(Grad ? silu_grad_x16(v, s) : _mm512_mul_ps(v, s), load_bf16x16(b + i)));
  }
  for (; i < n; ++i)
    o[i] = Grad ? BFloat16(SiluGradMulOp<CpuMath>::apply(float(a[i]), float(b[i])))
                : BFloat16(SiluMulOp<CpuMath>::apply(float(a[i]), float(b[i])));
}
// SwiGLU's backward over [lo, hi) in whole vectors, as the composite computes it from the same instructions (mul, then
// the two runs above: d gate = silu'(a) round(g b), d up = silu(a) g); returns where the vectors stop.
int64_t swiglu_backward_bf16_run(const BFloat16* g, const BFloat16* a, const BFloat16* b, BFloat16* da, BFloat16* db,
                                 int64_t lo, int64_t hi) {
  for (; lo + 16 <= hi; lo += 16) {
    const __m512 v = load_bf16x16(a + lo), s = sigmoid_x16(v), gi = load_bf16x16(g + lo);
    store_bf16x16(da + lo, _mm512_mul_ps(silu_grad_x16(v, s), round_bf16_x16(_mm512_mul_ps(gi, load_bf16x16(b + lo)))));
    store_bf16x16(db + lo, _mm512_mul_ps(_mm512_mul_ps(v, s), gi));
  }
  return lo;
}
#define WEFT_BF16_VECTOR_LOOPS 1
#endif

// Runs run(a, b, out, n) on each thread's piece of bf16 operands of out's shape, all unit-stride
// (b may be undefined); false where they are not.
template <class Run>
bool bf16_unit_runs(const Tensor& out, const Tensor& a, const Tensor& b, Run run) {
  auto fits = [&](const Tensor& t) { return t.dtype() == DType::bf16 && t.is_contiguous() && t.shape() == out.shape(); };
  if (!fits(out) || !a.defined() || !fits(a) || (b.defined() && !fits(b))) return false;
  const BFloat16 *pa = ptr<const BFloat16>(a), *pb = b.defined() ? ptr<const BFloat16>(b) : nullptr;
  BFloat16* po = ptr<BFloat16>(out);
  parallel_range(out.numel(), kParallelGrain / 2, 64,
                 [&](int64_t lo, int64_t hi) { run(pa + lo, pb ? pb + lo : nullptr, po + lo, hi - lo); });
  return true;
}

// ---- unary

template <class T>
void unary_typed(UnaryOp op, const Tensor& out, const Tensor& x) {
  using A = acc_t<T>;
  if (op == UnaryOp::logical_not) {
    map1<bool, T>([](T v) { return !(A(v) != A(0)); }, out, x);
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (op == UnaryOp::sqrt || op == UnaryOp::rsqrt) return sqrt_map<T>(op == UnaryOp::rsqrt, out, x);
  }
#ifdef WEFT_BF16_VECTOR_LOOPS
  if (op == UnaryOp::gelu_tanh && bf16_unit_runs(out, x, Tensor(), gelu_bf16_run<false>)) return;
#endif
  bool done = false;
  with_unary_op(op, [&]<UnaryOp OP>() {
    if constexpr (unary_supported<is_float_v<T>, std::is_same_v<T, bool>>(OP)) {
      map1_acc<T, T>([](A v) { return UnaryFn<OP, CpuMath>{}(v); }, out, x);
      done = true;
    }
  });
  WEFT_CHECK(done, "{}: not implemented for {}", unary_op_name(op), dtype_name(x.dtype()));
}

template <class T>
void unary_backward_typed(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y) {
  using A = acc_t<T>;
  switch (op) {
    case UnaryOp::neg: return map1<T, T>([](T g) { return T(-A(g)); }, gx, grad);
    case UnaryOp::sign:
    case UnaryOp::logical_not: return map1<T, T>([](T) { return T(0.f); }, gx, grad);
    default: break;
  }
#ifdef WEFT_BF16_VECTOR_LOOPS
  if (op == UnaryOp::gelu_tanh && x.defined() && bf16_unit_runs(gx, x, grad, gelu_bf16_run<true>)) return;
#endif
  // gx = g * D(v) where v is x or y, whichever the derivative is cheaper from.
  const Tensor& v = y.defined() ? y : x;
  with_unary_op(op, [&]<UnaryOp OP>() {
    if constexpr (OP != UnaryOp::neg && OP != UnaryOp::sign && OP != UnaryOp::logical_not)
      map2_acc<T, T>([](A g, A v) { return g * GradFn<OP, CpuMath>{}(v); }, gx, grad, v);
  });
}

}  // namespace

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  WEFT_DISPATCH(x.dtype(), unary_op_name(op), [&]<typename T>() { unary_typed<T>(op, out, x); });
}

void unary_backward(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y) {
  WEFT_DISPATCH_FLOAT(grad.dtype(), unary_op_name(op),
                      [&]<typename T>() { unary_backward_typed<T>(op, gx, grad, x, y); });
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
#ifdef WEFT_BF16_VECTOR_LOOPS
  if (op == BinaryOp::silu_mul && bf16_unit_runs(out, a, b, silu_mul_bf16_run<false>)) return;
  if (op == BinaryOp::silu_grad_mul && bf16_unit_runs(out, a, b, silu_mul_bf16_run<true>)) return;
#endif
  WEFT_DISPATCH(a.dtype(), binary_op_name(op), [&]<typename T>() {
    using A = acc_t<T>;
    bool done = with_binary_op<T, is_float_v<T>, CpuMath>(op, [&]<class Op, class O>() {
      map2_acc<O, T, true>([](A x, A y) { return Op::apply(x, y); }, out, a, b);
    });
    WEFT_CHECK(done, "{}: not implemented for {}", binary_op_name(op), dtype_name(a.dtype()));
  });
}

void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  WEFT_DISPATCH_FLOAT(grad.dtype(), "swiglu_backward", [&]<typename T>() {
    using A = acc_t<T>;
    const T *g = ptr<const T>(grad), *a = ptr<const T>(gate), *b = ptr<const T>(up);
    T *da = ptr<T>(dgate), *db = ptr<T>(dup);
    parallel_range(grad.numel(), kParallelGrain / 2, 64, [&](int64_t lo, int64_t hi) {
#ifdef WEFT_BF16_VECTOR_LOOPS
      if constexpr (std::is_same_v<T, BFloat16>) lo = swiglu_backward_bf16_run(g, a, b, da, db, lo, hi);
#endif
      for (int64_t i = lo; i < hi; ++i) {  // the composite's three loops, t = g b rounded to T
        store_as(da[i], SiluGradMulOp<CpuMath>::apply(A(a[i]), A(T(A(g[i]) * A(b[i])))));
        store_as(db[i], SiluMulOp<CpuMath>::apply(A(a[i]), A(g[i])));
      }
    });
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first) {
  // Only sub, div and pow need s op a as such; the rest commute or flip (s < a is a > s).
  if (scalar_first && op != BinaryOp::sub && op != BinaryOp::div && op != BinaryOp::pow &&
      op != BinaryOp::silu_mul && op != BinaryOp::silu_grad_mul) {
    scalar_first = false;
    if (op == BinaryOp::lt) op = BinaryOp::gt;
    else if (op == BinaryOp::gt) op = BinaryOp::lt;
    else if (op == BinaryOp::le) op = BinaryOp::ge;
    else if (op == BinaryOp::ge) op = BinaryOp::le;
  }
  WEFT_DISPATCH(a.dtype(), binary_op_name(op), [&]<typename T>() {
    using A = acc_t<T>;
    A sv = scalar_as<A>(s);
    bool done = with_binary_op<T, is_float_v<T>, CpuMath>(op, [&]<class Op, class O>() {
      constexpr bool kReversible = std::is_same_v<Op, SubOp> || std::is_same_v<Op, DivOp> || std::is_same_v<Op, PowOp>;
      if constexpr (kReversible) {
        if (scalar_first) return map1_acc<O, T>([sv](A x) { return Op::apply(sv, x); }, out, a);
      }
      map1_acc<O, T>([sv](A x) { return Op::apply(x, sv); }, out, a);
    });
    WEFT_CHECK(done, "{}: not implemented for {}", binary_op_name(op), dtype_name(a.dtype()));
  });
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  WEFT_DISPATCH(dst.dtype(), "add_", [&]<typename T>() {
    using A = acc_t<T>;
    A al = scalar_as<A>(alpha);
    if (alpha == 1.0) inplace2_acc<T>([](A d, A s) { return AddOp::apply(d, s); }, dst, src);
    else inplace2_acc<T>([al](A d, A s) { return AddOp::apply(d, MulOp::apply(al, s)); }, dst, src);
  });
}

void mul_scalar_(const Tensor& dst, double s) {
  WEFT_DISPATCH(dst.dtype(), "mul_scalar_", [&]<typename T>() {
    using A = acc_t<T>;
    A sv = scalar_as<A>(s);
    inplace1_acc<T>([sv](A d) { return MulOp::apply(d, sv); }, dst);
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  // bool and u8 conditions are both one byte holding 0 or not.
  WEFT_DISPATCH(out.dtype(), "where", [&]<typename T>() {
    map3<T, uint8_t, T, T>([](uint8_t c, T x, T y) { return c ? x : y; }, out, cond, a, b);
  });
}

void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  WEFT_DISPATCH(out.dtype(), "masked_fill", [&]<typename T>() {
    T v = T(scalar_as<acc_t<T>>(value));
    map2<T, T, uint8_t>([v](T x, uint8_t m) { return m ? v : x; }, out, x, mask);
  });
}

void clamp(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  WEFT_DISPATCH(out.dtype(), "clamp", [&]<typename T>() {
    using A = acc_t<T>;
    A l = bound_as<A>(lo.value_or(0)), h = bound_as<A>(hi.value_or(0));
    // Comparisons are false for NaN, so a NaN input passes through as NaN.
    if (lo && hi) map1<T, T>([l, h](T v) { A a = A(v); a = a < l ? l : a; return T(a > h ? h : a); }, out, x);
    else if (lo) map1<T, T>([l](T v) { A a = A(v); return T(a < l ? l : a); }, out, x);
    else map1<T, T>([h](T v) { A a = A(v); return T(a > h ? h : a); }, out, x);
  });
}

}  // namespace weft::kernels::cpu
