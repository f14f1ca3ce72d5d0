// kernels: the scalar formulas of the element-wise ops, written once for the CPU loops (g++)
// and the CUDA kernels (nvcc): integer arithmetic that wraps, integer powers, the unary ops
// and their derivatives, the binary ops, and how a host double becomes an operand.
//
// Free of fmt and core/tensor.h so that nvcc can include it. Floating math goes through a policy class M (LibMath here;
// the CPU substitutes float versions that vectorise, kernels/cpu/elementwise.cpp), so that both backends share every
// formula while each keeps its own exp/tanh. Everything is forced inline: the CPU loops must still vectorise.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "op_kinds.h"

#if defined(__CUDACC__)
#define WEFT_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define WEFT_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace weft::kernels::scalar {

// ---- integers: arithmetic wraps like the hardware (through the unsigned type: signed
// overflow is undefined behaviour).
template <class T> WEFT_HOST_DEVICE T wrap_add(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) + U(b)); }
template <class T> WEFT_HOST_DEVICE T wrap_sub(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) - U(b)); }
template <class T> WEFT_HOST_DEVICE T wrap_mul(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) * U(b)); }

// Integer power by squaring; negative exponents give the truncated result (0 unless |b| == 1).
template <class T> WEFT_HOST_DEVICE T int_pow(T b, T e) {
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

// ---- floating math

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluC = 0.044715;
inline constexpr double kInvSqrt2 = 0.70710678118654752440;
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// The C library's functions on float and double (host and device).
struct LibMath {
#define WEFT_LIBMATH_1(name, f32fn, f64fn)                                   \
  WEFT_HOST_DEVICE static float name(float x) { return ::f32fn(x); }         \
  WEFT_HOST_DEVICE static double name(double x) { return ::f64fn(x); }
  WEFT_LIBMATH_1(exp, expf, exp)
  WEFT_LIBMATH_1(log, logf, log)
  WEFT_LIBMATH_1(sqrt, sqrtf, sqrt)
  WEFT_LIBMATH_1(tanh, tanhf, tanh)
  WEFT_LIBMATH_1(sin, sinf, sin)
  WEFT_LIBMATH_1(cos, cosf, cos)
  WEFT_LIBMATH_1(log1p, log1pf, log1p)
  WEFT_LIBMATH_1(expm1, expm1f, expm1)
  WEFT_LIBMATH_1(erfc, erfcf, erfc)
  WEFT_LIBMATH_1(fabs, fabsf, fabs)
#undef WEFT_LIBMATH_1
  WEFT_HOST_DEVICE static float pow(float a, float b) { return ::powf(a, b); }
  WEFT_HOST_DEVICE static double pow(double a, double b) { return ::pow(a, b); }

  // 1 / (1 + e^-x) without overflow for large |x|.
  template <class A> WEFT_HOST_DEVICE static A sigmoid(A x) {
    A e = exp(-fabs(x)), r = A(1) / (A(1) + e);
    return x >= A(0) ? r : e * r;
  }
  // Phi(x) through erfc, which keeps precision where erf is close to -1.
  template <class A> WEFT_HOST_DEVICE static A normal_cdf(A x) { return A(0.5) * erfc(-x * A(kInvSqrt2)); }
  template <class A> WEFT_HOST_DEVICE static A normal_pdf(A x) { return A(kInvSqrt2Pi) * exp(A(-0.5) * x * x); }
};

// gelu_tanh(x) = 0.5x(1 + tanh(u)) = x * sigmoid(2u): the sigmoid form does not cancel for large negative x.
template <class M, class A> WEFT_HOST_DEVICE A gelu_tanh(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  return x * M::sigmoid(A(2) * u);
}
template <class M, class A> WEFT_HOST_DEVICE A gelu_tanh_grad(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  A s = M::sigmoid(A(2) * u);
  A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
  return s + A(2) * x * s * (A(1) - s) * du;
}
// gelu_erf(x) = x * Phi(x).
template <class M, class A> WEFT_HOST_DEVICE A gelu_erf(A x) { return x * M::normal_cdf(x); }
template <class M, class A> WEFT_HOST_DEVICE A gelu_erf_grad(A x) { return M::normal_cdf(x) + x * M::normal_pdf(x); }

// silu(x) = x * sigmoid(x), as torch.nn.functional.silu; silu'(x) = s + x s (1 - s).
template <class M, class A> WEFT_HOST_DEVICE A silu(A x) { return x * M::sigmoid(x); }
template <class M, class A> WEFT_HOST_DEVICE A silu_grad(A x) {
  A s = M::sigmoid(x);
  return s + x * s * (A(1) - s);
}

// ---- unary ops on the arithmetic type A (float, double or an integer type)

// Whether the entry points send `op` for compute type T (kernels/elementwise.cpp: integers
// take only these; bool only logical_not, which the backends handle apart).
template <bool kFloat, bool kBool> constexpr bool unary_supported(UnaryOp op) {
  if constexpr (kBool) return false;
  else if constexpr (kFloat) return op != UnaryOp::logical_not;
  else return op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::sign || op == UnaryOp::relu ||
              op == UnaryOp::square;
}

template <UnaryOp OP, class M> struct UnaryFn {
  template <class A> WEFT_HOST_DEVICE A operator()(A v) const {
    if constexpr (std::is_integral_v<A>) {
      if constexpr (OP == UnaryOp::neg) return wrap_sub(A(0), v);
      else if constexpr (OP == UnaryOp::abs) { if constexpr (std::is_signed_v<A>) return v < 0 ? wrap_sub(A(0), v) : v; else return v; }
      else if constexpr (OP == UnaryOp::sign) { if constexpr (std::is_signed_v<A>) return A((v > 0) - (v < 0)); else return A(v > 0); }
      else if constexpr (OP == UnaryOp::relu) { if constexpr (std::is_signed_v<A>) return v < 0 ? A(0) : v; else return v; }
      else return wrap_mul(v, v);  // square
    } else {
      if constexpr (OP == UnaryOp::neg) return -v;
      else if constexpr (OP == UnaryOp::exp) return M::exp(v);
      else if constexpr (OP == UnaryOp::log) return M::log(v);
      else if constexpr (OP == UnaryOp::sqrt) return M::sqrt(v);
      else if constexpr (OP == UnaryOp::rsqrt) return A(1) / M::sqrt(v);
      else if constexpr (OP == UnaryOp::abs) return M::fabs(v);
      else if constexpr (OP == UnaryOp::tanh) return M::tanh(v);
      else if constexpr (OP == UnaryOp::sigmoid) return M::sigmoid(v);
      else if constexpr (OP == UnaryOp::relu) return v < A(0) ? A(0) : v;  // NaN stays NaN
      else if constexpr (OP == UnaryOp::gelu_tanh) return gelu_tanh<M>(v);
      else if constexpr (OP == UnaryOp::gelu_erf) return gelu_erf<M>(v);
      else if constexpr (OP == UnaryOp::silu) return silu<M>(v);
      else if constexpr (OP == UnaryOp::sin) return M::sin(v);
      else if constexpr (OP == UnaryOp::cos) return M::cos(v);
      else if constexpr (OP == UnaryOp::square) return v * v;
      else if constexpr (OP == UnaryOp::reciprocal) return A(1) / v;
      else if constexpr (OP == UnaryOp::sign) return v > A(0) ? A(1) : v < A(0) ? A(-1) : v == v ? v : A(0);  // NaN: 0
      else if constexpr (OP == UnaryOp::log1p) return M::log1p(v);
      else return M::expm1(v);  // expm1
    }
  }
};

// The derivative's factor D(v) in gx = g * D(v). v is the saved output y for exp, sqrt, rsqrt,
// tanh, sigmoid and reciprocal, else the input x (kernels/elementwise.h); neg, sign and
// logical_not need neither and are handled by the backends.
template <UnaryOp OP, class M> struct GradFn {
  template <class A> WEFT_HOST_DEVICE A operator()(A v) const {
    if constexpr (OP == UnaryOp::exp) return v;
    else if constexpr (OP == UnaryOp::log) return A(1) / v;
    else if constexpr (OP == UnaryOp::sqrt) return A(0.5) / v;
    else if constexpr (OP == UnaryOp::rsqrt) return A(-0.5) * v * v * v;
    else if constexpr (OP == UnaryOp::abs) return v > A(0) ? A(1) : v < A(0) ? A(-1) : A(0);
    else if constexpr (OP == UnaryOp::tanh) return A(1) - v * v;
    else if constexpr (OP == UnaryOp::sigmoid) return v * (A(1) - v);
    else if constexpr (OP == UnaryOp::relu) return v <= A(0) ? A(0) : A(1);  // NaN passes, as torch
    else if constexpr (OP == UnaryOp::gelu_tanh) return gelu_tanh_grad<M>(v);
    else if constexpr (OP == UnaryOp::gelu_erf) return gelu_erf_grad<M>(v);
    else if constexpr (OP == UnaryOp::silu) return silu_grad<M>(v);
    else if constexpr (OP == UnaryOp::sin) return M::cos(v);
    else if constexpr (OP == UnaryOp::cos) return -M::sin(v);
    else if constexpr (OP == UnaryOp::square) return A(2) * v;
    else if constexpr (OP == UnaryOp::reciprocal) return -v * v;
    else if constexpr (OP == UnaryOp::log1p) return A(1) / (A(1) + v);
    else return M::exp(v);  // expm1
  }
};

// Calls fn.template operator()<OP>() for the runtime op (one instantiation per op); false for a value outside the enum.
template <class F> bool with_unary_op(UnaryOp op, F&& fn) {
  switch (op) {
#define WEFT_CASE(name) case UnaryOp::name: fn.template operator()<UnaryOp::name>(); return true;
    WEFT_CASE(neg) WEFT_CASE(exp) WEFT_CASE(log) WEFT_CASE(sqrt) WEFT_CASE(rsqrt) WEFT_CASE(abs)
    WEFT_CASE(tanh) WEFT_CASE(sigmoid) WEFT_CASE(relu) WEFT_CASE(gelu_tanh) WEFT_CASE(gelu_erf)
    WEFT_CASE(silu) WEFT_CASE(sin) WEFT_CASE(cos) WEFT_CASE(square) WEFT_CASE(reciprocal) WEFT_CASE(sign)
    WEFT_CASE(log1p) WEFT_CASE(expm1) WEFT_CASE(logical_not)
#undef WEFT_CASE
  }
  return false;
}

// ---- binary ops on the arithmetic type A (comparisons and logical ops give bool)

struct AddOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) {
  if constexpr (std::is_same_v<A, bool>) return a || b;
  else if constexpr (std::is_integral_v<A>) return wrap_add(a, b);
  else return a + b;
} };
struct SubOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) {
  if constexpr (std::is_integral_v<A>) return wrap_sub(a, b);
  else return a - b;
} };
struct MulOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) {
  if constexpr (std::is_same_v<A, bool>) return a && b;
  else if constexpr (std::is_integral_v<A>) return wrap_mul(a, b);
  else return a * b;
} };
struct DivOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) { return a / b; } };
struct PowOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) {
  if constexpr (std::is_integral_v<A>) return int_pow(a, b);
  else return LibMath::pow(a, b);
} };
// maximum/minimum propagate NaN from either side, as torch.maximum.
struct MaxOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) { return (a > b || a != a) ? a : b; } };
struct MinOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) { return (a < b || a != a) ? a : b; } };
struct EqOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a == b; } };
struct NeOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a != b; } };
struct LtOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a < b; } };
struct LeOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a <= b; } };
struct GtOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a > b; } };
struct GeOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a >= b; } };
struct AndOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a != A(0) && b != A(0); } };
struct OrOp { template <class A> WEFT_HOST_DEVICE static bool apply(A a, A b) { return a != A(0) || b != A(0); } };
// The two that call math take it as M (a backend's vectorising exp, or the C library's).
template <class M> struct SiluMulOp { template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) { return silu<M>(a) * b; } };
template <class M> struct SiluGradMulOp {
  template <class A> WEFT_HOST_DEVICE static A apply(A a, A b) { return silu_grad<M>(a) * b; }
};

// Calls fn.template operator()<Op, O>() for op on storage type T (O: the output type, T or bool); kFloat says whether T
// computes in floating point; M is the math the silu ops call. Ops the entry points never send for T (sub/pow on bool,
// div on integers) are not instantiated: returns false for them.
template <class T, bool kFloat, class M = LibMath, class F> bool with_binary_op(BinaryOp op, F&& fn) {
  constexpr bool is_bool = std::is_same_v<T, bool>;
  switch (op) {
#define WEFT_CASE(name, Op, O) case BinaryOp::name: fn.template operator()<Op, O>(); return true;
    WEFT_CASE(add, AddOp, T) WEFT_CASE(mul, MulOp, T) WEFT_CASE(maximum, MaxOp, T) WEFT_CASE(minimum, MinOp, T)
    WEFT_CASE(eq, EqOp, bool) WEFT_CASE(ne, NeOp, bool) WEFT_CASE(lt, LtOp, bool) WEFT_CASE(le, LeOp, bool)
    WEFT_CASE(gt, GtOp, bool) WEFT_CASE(ge, GeOp, bool) WEFT_CASE(logical_and, AndOp, bool)
    WEFT_CASE(logical_or, OrOp, bool)
#undef WEFT_CASE
    case BinaryOp::sub: if constexpr (!is_bool) { fn.template operator()<SubOp, T>(); return true; } break;
    case BinaryOp::div: if constexpr (kFloat) { fn.template operator()<DivOp, T>(); return true; } break;
    case BinaryOp::silu_mul: if constexpr (kFloat) { fn.template operator()<SiluMulOp<M>, T>(); return true; } break;
    case BinaryOp::silu_grad_mul:
      if constexpr (kFloat) { fn.template operator()<SiluGradMulOp<M>, T>(); return true; }
      break;
    case BinaryOp::pow: if constexpr (!is_bool) { fn.template operator()<PowOp, T>(); return true; } break;
  }
  return false;
}

// ---- host doubles as operands (host only)

// A double as the compute type A; for integers it truncates and wraps like a cast through
// int64 (NaN gives 0, out-of-range values saturate; no undefined conversions).
template <class A> inline A scalar_as(double s) {
  if constexpr (std::is_same_v<A, bool>) {
    return s != 0;
  } else if constexpr (std::is_integral_v<A>) {
    if (s != s) return A(0);
    return A(int64_t(s < -9.2e18 ? -9.2e18 : s > 9.2e18 ? 9.2e18 : s));
  } else {
    return A(s);
  }
}

// A clamp bound as A: integers saturate to A's range (clamping u8 to 1000 changes nothing).
template <class A> inline A bound_as(double s) {
  if constexpr (std::is_integral_v<A> && sizeof(A) < 8 && !std::is_same_v<A, bool>) {
    double lo = double(std::numeric_limits<A>::lowest()), hi = double(std::numeric_limits<A>::max());
    s = s < lo ? lo : s > hi ? hi : s;
  }
  return scalar_as<A>(s);
}

}  // namespace weft::kernels::scalar
