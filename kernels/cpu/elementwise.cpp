// kernels/cpu: the element-wise loops. Each op is a small functor on the accumulation type
// (float for 16-bit floats); the op switch runs once per call and the loops are templated
// on the functor, with unit/zero inner strides fixed at compile time so they vectorise.
#include "kernels/cpu/elementwise.h"

#include <type_traits>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "core/dispatch.h"
#include "core/strided_iter.h"

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

template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }
template <class T> constexpr bool is_float_v = std::is_floating_point_v<acc_t<T>>;

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

// out = f(a, b, c); used by where, whose operands are rarely all unit-stride except the
// plain case.
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

// ---- scalar helpers

// A double as the compute type A; for integers it truncates and wraps like a cast through
// int64 (NaN gives 0, no undefined conversions).
template <class A> A scalar_as(double s) {
  if constexpr (std::is_same_v<A, bool>) return s != 0;
  else if constexpr (std::is_integral_v<A>) return s != s ? A(0) : A(int64_t(std::clamp(s, -9.2e18, 9.2e18)));
  else return A(s);
}

// A clamp bound as A: integers saturate to A's range (clamping u8 to 1000 changes nothing).
template <class A> A bound_as(double s) {
  if constexpr (std::is_integral_v<A> && sizeof(A) < 8 && !std::is_same_v<A, bool>)
    s = std::clamp(s, double(std::numeric_limits<A>::lowest()), double(std::numeric_limits<A>::max()));
  return scalar_as<A>(s);
}

// Integer arithmetic wraps like the hardware (through the unsigned type: signed overflow is UB).
template <class T> T wrap_add(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) + U(b)); }
template <class T> T wrap_sub(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) - U(b)); }
template <class T> T wrap_mul(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) * U(b)); }

// Integer power by squaring; negative exponents give the truncated result (0 unless |b| == 1).
template <class T> T int_pow(T b, T e) {
  if constexpr (std::is_signed_v<T>) {
    if (e < 0) return b == 1 ? T(1) : b == -1 ? T((e & 1) ? -1 : 1) : T(0);
  }
  T r = 1;
  while (e) {
    if (e & 1) r = wrap_mul(r, b);
    b = wrap_mul(b, b);
    e = T(e >> 1);
  }
  return r;
}

WEFT_MATH_INLINE float v_exp(float x) { return exp_f32(x); }
WEFT_MATH_INLINE double v_exp(double x) { return std::exp(x); }
WEFT_MATH_INLINE float v_tanh(float x) { return tanh_f32(x); }
WEFT_MATH_INLINE double v_tanh(double x) { return std::tanh(x); }
WEFT_MATH_INLINE float v_sigmoid(float x) { return sigmoid_f32(x); }
WEFT_MATH_INLINE double v_sigmoid(double x) {
  double e = std::exp(-std::fabs(x)), r = 1.0 / (1.0 + e);
  return x >= 0 ? r : e * r;
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluC = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// gelu_tanh(x) = 0.5x(1 + tanh(u)) = x * sigmoid(2u): the sigmoid form does not cancel for
// large negative x.
template <class A> WEFT_MATH_INLINE A gelu_tanh(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  return x * v_sigmoid(A(2) * u);
}
template <class A> WEFT_MATH_INLINE A gelu_tanh_grad(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  A s = v_sigmoid(A(2) * u);
  A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
  return s + A(2) * x * s * (A(1) - s) * du;
}
// gelu_erf(x) = x * Phi(x); 1 + erf(x/sqrt2) as erfc(-x/sqrt2) keeps precision where erf is
// close to -1.
WEFT_MATH_INLINE float normal_cdf(float x) { return normal_cdf_f32(x); }
WEFT_MATH_INLINE double normal_cdf(double x) { return 0.5 * std::erfc(-x * kInvSqrt2); }
WEFT_MATH_INLINE float normal_pdf(float x) { return float(kInvSqrt2Pi) * exp_neg_half_sq_f32(x); }
WEFT_MATH_INLINE double normal_pdf(double x) { return kInvSqrt2Pi * std::exp(-0.5 * x * x); }
template <class A> WEFT_MATH_INLINE A gelu_erf(A x) { return x * normal_cdf(x); }
template <class A> WEFT_MATH_INLINE A gelu_erf_grad(A x) { return normal_cdf(x) + x * normal_pdf(x); }

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

template <class A> A float_sign(A v) { return v > A(0) ? A(1) : v < A(0) ? A(-1) : v; }  // NaN stays NaN

// ---- unary

template <class T>
void unary_typed(UnaryOp op, const Tensor& out, const Tensor& x) {
  using A = acc_t<T>;
  if (op == UnaryOp::logical_not) {
    map1<bool, T>([](T v) { return !(A(v) != A(0)); }, out, x);
    return;
  }
  auto run = [&](auto f) { map1<T, T>([f](T v) { return T(f(A(v))); }, out, x); };
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (op == UnaryOp::sqrt || op == UnaryOp::rsqrt) return sqrt_map<T>(op == UnaryOp::rsqrt, out, x);
  }
  if constexpr (is_float_v<T>) {
    switch (op) {
      case UnaryOp::neg: return run([](A v) { return -v; });
      case UnaryOp::exp: return run([](A v) { return v_exp(v); });
      case UnaryOp::log: return run([](A v) { return std::log(v); });
      case UnaryOp::sqrt: return run([](A v) { return std::sqrt(v); });
      case UnaryOp::rsqrt: return run([](A v) { return A(1) / std::sqrt(v); });
      case UnaryOp::abs: return run([](A v) { return std::fabs(v); });
      case UnaryOp::tanh: return run([](A v) { return v_tanh(v); });
      case UnaryOp::sigmoid: return run([](A v) { return v_sigmoid(v); });
      case UnaryOp::relu: return run([](A v) { return v < A(0) ? A(0) : v; });  // NaN stays NaN
      case UnaryOp::gelu_tanh: return run([](A v) { return gelu_tanh(v); });
      case UnaryOp::gelu_erf: return run([](A v) { return gelu_erf(v); });
      case UnaryOp::sin: return run([](A v) { return std::sin(v); });
      case UnaryOp::cos: return run([](A v) { return std::cos(v); });
      case UnaryOp::square: return run([](A v) { return v * v; });
      case UnaryOp::reciprocal: return run([](A v) { return A(1) / v; });
      case UnaryOp::sign: return run([](A v) { return float_sign(v); });
      case UnaryOp::log1p: return run([](A v) { return std::log1p(v); });
      case UnaryOp::expm1: return run([](A v) { return std::expm1(v); });
      case UnaryOp::logical_not: break;
    }
  } else if constexpr (!std::is_same_v<T, bool>) {
    switch (op) {
      case UnaryOp::neg: return run([](T v) { return wrap_sub(T(0), v); });
      case UnaryOp::abs:
        if constexpr (std::is_signed_v<T>) return run([](T v) { return v < 0 ? wrap_sub(T(0), v) : v; });
        else return run([](T v) { return v; });
      case UnaryOp::sign:
        if constexpr (std::is_signed_v<T>) return run([](T v) { return T((v > 0) - (v < 0)); });
        else return run([](T v) { return T(v > 0); });
      case UnaryOp::relu:
        if constexpr (std::is_signed_v<T>) return run([](T v) { return v < 0 ? T(0) : v; });
        else return run([](T v) { return v; });
      case UnaryOp::square: return run([](T v) { return wrap_mul(v, v); });
      default: break;
    }
  }
  WEFT_ERROR("{}: not implemented for {}", unary_op_name(op), dtype_name(x.dtype()));
}

template <class T>
void unary_backward_typed(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y) {
  using A = acc_t<T>;
  // gx = g * f(v) where v is x or y, whichever the derivative is cheaper from.
  auto with = [&](const Tensor& v, auto f) {
    map2<T, T, T>([f](T g, T v) { return T(A(g) * f(A(v))); }, gx, grad, v);
  };
  switch (op) {
    case UnaryOp::neg: return map1<T, T>([](T g) { return T(-A(g)); }, gx, grad);
    case UnaryOp::exp: return with(y, [](A v) { return v; });
    case UnaryOp::log: return with(x, [](A v) { return A(1) / v; });
    case UnaryOp::sqrt: return with(y, [](A v) { return A(0.5) / v; });
    case UnaryOp::rsqrt: return with(y, [](A v) { return A(-0.5) * v * v * v; });
    case UnaryOp::abs: return with(x, [](A v) { return v > A(0) ? A(1) : v < A(0) ? A(-1) : A(0); });
    case UnaryOp::tanh: return with(y, [](A v) { return A(1) - v * v; });
    case UnaryOp::sigmoid: return with(y, [](A v) { return v * (A(1) - v); });
    case UnaryOp::relu: return with(x, [](A v) { return v > A(0) ? A(1) : A(0); });
    case UnaryOp::gelu_tanh: return with(x, [](A v) { return gelu_tanh_grad(v); });
    case UnaryOp::gelu_erf: return with(x, [](A v) { return gelu_erf_grad(v); });
    case UnaryOp::sin: return with(x, [](A v) { return std::cos(v); });
    case UnaryOp::cos: return with(x, [](A v) { return -std::sin(v); });
    case UnaryOp::square: return with(x, [](A v) { return A(2) * v; });
    case UnaryOp::reciprocal: return with(y, [](A v) { return -v * v; });
    case UnaryOp::log1p: return with(x, [](A v) { return A(1) / (A(1) + v); });
    case UnaryOp::expm1: return with(x, [](A v) { return v_exp(v); });
    case UnaryOp::sign:
    case UnaryOp::logical_not: return map1<T, T>([](T) { return T(0.f); }, gx, grad);
  }
}

// ---- binary: each op is a functor on the compute type A

struct AddOp { template <class A> static A apply(A a, A b) {
  if constexpr (std::is_same_v<A, bool>) return a || b;
  else if constexpr (std::is_integral_v<A>) return wrap_add(a, b);
  else return a + b;
} };
struct SubOp { template <class A> static A apply(A a, A b) {
  if constexpr (std::is_integral_v<A>) return wrap_sub(a, b);
  else return a - b;
} };
struct MulOp { template <class A> static A apply(A a, A b) {
  if constexpr (std::is_same_v<A, bool>) return a && b;
  else if constexpr (std::is_integral_v<A>) return wrap_mul(a, b);
  else return a * b;
} };
struct DivOp { template <class A> static A apply(A a, A b) { return a / b; } };
struct PowOp { template <class A> static A apply(A a, A b) {
  if constexpr (std::is_integral_v<A>) return int_pow(a, b);
  else return std::pow(a, b);
} };
// maximum/minimum propagate NaN from either side, as torch.maximum.
struct MaxOp { template <class A> static A apply(A a, A b) { return (a > b || a != a) ? a : b; } };
struct MinOp { template <class A> static A apply(A a, A b) { return (a < b || a != a) ? a : b; } };
struct EqOp { template <class A> static bool apply(A a, A b) { return a == b; } };
struct NeOp { template <class A> static bool apply(A a, A b) { return a != b; } };
struct LtOp { template <class A> static bool apply(A a, A b) { return a < b; } };
struct LeOp { template <class A> static bool apply(A a, A b) { return a <= b; } };
struct GtOp { template <class A> static bool apply(A a, A b) { return a > b; } };
struct GeOp { template <class A> static bool apply(A a, A b) { return a >= b; } };
struct AndOp { template <class A> static bool apply(A a, A b) { return a != A(0) && b != A(0); } };
struct OrOp { template <class A> static bool apply(A a, A b) { return a != A(0) || b != A(0); } };

// Calls fn.template operator()<Op, O>() for op and compute type T (O: the output type).
// Ops the public layer never sends for T (sub/pow on bool, div on integers) are not
// instantiated.
template <class T, class F>
void with_binary_op(BinaryOp op, F&& fn) {
  constexpr bool is_bool = std::is_same_v<T, bool>;
  switch (op) {
    case BinaryOp::add: return fn.template operator()<AddOp, T>();
    case BinaryOp::sub: if constexpr (!is_bool) return fn.template operator()<SubOp, T>(); break;
    case BinaryOp::mul: return fn.template operator()<MulOp, T>();
    case BinaryOp::div: if constexpr (is_float_v<T>) return fn.template operator()<DivOp, T>(); break;
    case BinaryOp::pow: if constexpr (!is_bool) return fn.template operator()<PowOp, T>(); break;
    case BinaryOp::maximum: return fn.template operator()<MaxOp, T>();
    case BinaryOp::minimum: return fn.template operator()<MinOp, T>();
    case BinaryOp::eq: return fn.template operator()<EqOp, bool>();
    case BinaryOp::ne: return fn.template operator()<NeOp, bool>();
    case BinaryOp::lt: return fn.template operator()<LtOp, bool>();
    case BinaryOp::le: return fn.template operator()<LeOp, bool>();
    case BinaryOp::gt: return fn.template operator()<GtOp, bool>();
    case BinaryOp::ge: return fn.template operator()<GeOp, bool>();
    case BinaryOp::logical_and: return fn.template operator()<AndOp, bool>();
    case BinaryOp::logical_or: return fn.template operator()<OrOp, bool>();
  }
  WEFT_ERROR("{}: not implemented for {}", binary_op_name(op), dtype_name(dtype_of<T>()));
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
  WEFT_DISPATCH(a.dtype(), binary_op_name(op), [&]<typename T>() {
    using A = acc_t<T>;
    with_binary_op<T>(op, [&]<class Op, class O>() {
      map2<O, T, T, true>([](T x, T y) { return O(Op::apply(A(x), A(y))); }, out, a, b);
    });
  });
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first) {
  // Only sub, div and pow need s op a as such; the rest commute or flip (s < a is a > s).
  if (scalar_first && op != BinaryOp::sub && op != BinaryOp::div && op != BinaryOp::pow) {
    scalar_first = false;
    if (op == BinaryOp::lt) op = BinaryOp::gt;
    else if (op == BinaryOp::gt) op = BinaryOp::lt;
    else if (op == BinaryOp::le) op = BinaryOp::ge;
    else if (op == BinaryOp::ge) op = BinaryOp::le;
  }
  WEFT_DISPATCH(a.dtype(), binary_op_name(op), [&]<typename T>() {
    using A = acc_t<T>;
    A sv = scalar_as<A>(s);
    with_binary_op<T>(op, [&]<class Op, class O>() {
      constexpr bool kReversible = std::is_same_v<Op, SubOp> || std::is_same_v<Op, DivOp> || std::is_same_v<Op, PowOp>;
      if constexpr (kReversible) {
        if (scalar_first) return map1<O, T>([sv](T x) { return O(Op::apply(sv, A(x))); }, out, a);
      }
      map1<O, T>([sv](T x) { return O(Op::apply(A(x), sv)); }, out, a);
    });
  });
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  WEFT_DISPATCH(dst.dtype(), "add_", [&]<typename T>() {
    using A = acc_t<T>;
    A al = scalar_as<A>(alpha);
    if (alpha == 1.0) inplace2<T, T>([](T d, T s) { return T(AddOp::apply(A(d), A(s))); }, dst, src);
    else inplace2<T, T>([al](T d, T s) { return T(AddOp::apply(A(d), MulOp::apply(al, A(s)))); }, dst, src);
  });
}

void mul_scalar_(const Tensor& dst, double s) {
  WEFT_DISPATCH(dst.dtype(), "mul_scalar_", [&]<typename T>() {
    using A = acc_t<T>;
    A sv = scalar_as<A>(s);
    inplace1<T>([sv](T d) { return T(MulOp::apply(A(d), sv)); }, dst);
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
