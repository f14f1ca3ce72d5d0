// kernels/cuda: scalar math for the element-wise kernels, one overload per arithmetic type
// (float, double; integers where it applies), with the semantics of kernels/cpu: integer
// arithmetic wraps, max/min propagate NaN, gelu in its stable forms. Device-only header.
#pragma once
#include "kernels/cuda/common.cuh"

namespace weft::kernels::cuda::math {

#define WEFT_CUDA_MATH_1(name, f32fn, f64fn)                                        \
  __device__ __forceinline__ float name(float x) { return f32fn(x); }               \
  __device__ __forceinline__ double name(double x) { return f64fn(x); }
WEFT_CUDA_MATH_1(exp_, expf, ::exp)
WEFT_CUDA_MATH_1(log_, logf, ::log)
WEFT_CUDA_MATH_1(sqrt_, sqrtf, ::sqrt)
WEFT_CUDA_MATH_1(tanh_, tanhf, ::tanh)
WEFT_CUDA_MATH_1(sin_, sinf, ::sin)
WEFT_CUDA_MATH_1(cos_, cosf, ::cos)
WEFT_CUDA_MATH_1(log1p_, log1pf, ::log1p)
WEFT_CUDA_MATH_1(expm1_, expm1f, ::expm1)
WEFT_CUDA_MATH_1(erfc_, erfcf, ::erfc)
WEFT_CUDA_MATH_1(fabs_, fabsf, ::fabs)
#undef WEFT_CUDA_MATH_1
__device__ __forceinline__ float pow_(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double pow_(double a, double b) { return ::pow(a, b); }

// Integer arithmetic wraps like the hardware (through the unsigned type: signed overflow is UB).
template <class T> __device__ __forceinline__ T wrap_add(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) + U(b)); }
template <class T> __device__ __forceinline__ T wrap_sub(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) - U(b)); }
template <class T> __device__ __forceinline__ T wrap_mul(T a, T b) { using U = std::make_unsigned_t<T>; return T(U(a) * U(b)); }

// Integer power by squaring; negative exponents give the truncated result (0 unless |b| == 1).
template <class T> __device__ T int_pow(T b, T e) {
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

template <class A> __device__ __forceinline__ A sigmoid(A x) {
  A e = exp_(-fabs_(x)), r = A(1) / (A(1) + e);
  return x >= A(0) ? r : e * r;
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluC = 0.044715;
constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

// gelu_tanh(x) = 0.5x(1 + tanh(u)) = x * sigmoid(2u), which does not cancel for large -x.
template <class A> __device__ __forceinline__ A gelu_tanh(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  return x * sigmoid(A(2) * u);
}
template <class A> __device__ __forceinline__ A gelu_tanh_grad(A x) {
  A u = A(kSqrt2OverPi) * (x + A(kGeluC) * x * x * x);
  A s = sigmoid(A(2) * u);
  A du = A(kSqrt2OverPi) * (A(1) + A(3 * kGeluC) * x * x);
  return s + A(2) * x * s * (A(1) - s) * du;
}
// gelu_erf(x) = x * Phi(x), Phi through erfc to keep precision where erf is close to -1.
template <class A> __device__ __forceinline__ A normal_cdf(A x) { return A(0.5) * erfc_(-x * A(kInvSqrt2)); }
template <class A> __device__ __forceinline__ A normal_pdf(A x) { return A(kInvSqrt2Pi) * exp_(A(-0.5) * x * x); }
template <class A> __device__ __forceinline__ A gelu_erf(A x) { return x * normal_cdf(x); }
template <class A> __device__ __forceinline__ A gelu_erf_grad(A x) { return normal_cdf(x) + x * normal_pdf(x); }

// ---- binary ops on the arithmetic type A (comparisons and logical ops give bool)
struct AddOp { template <class A> __device__ A operator()(A a, A b) const {
  if constexpr (std::is_same_v<A, bool>) return a || b;
  else if constexpr (std::is_integral_v<A>) return wrap_add(a, b);
  else return a + b;
} };
struct SubOp { template <class A> __device__ A operator()(A a, A b) const {
  if constexpr (std::is_integral_v<A>) return wrap_sub(a, b);
  else return a - b;
} };
struct MulOp { template <class A> __device__ A operator()(A a, A b) const {
  if constexpr (std::is_same_v<A, bool>) return a && b;
  else if constexpr (std::is_integral_v<A>) return wrap_mul(a, b);
  else return a * b;
} };
struct DivOp { template <class A> __device__ A operator()(A a, A b) const { return a / b; } };
struct PowOp { template <class A> __device__ A operator()(A a, A b) const {
  if constexpr (std::is_integral_v<A>) return int_pow(a, b);
  else return pow_(a, b);
} };
struct MaxOp { template <class A> __device__ A operator()(A a, A b) const { return (a > b || a != a) ? a : b; } };
struct MinOp { template <class A> __device__ A operator()(A a, A b) const { return (a < b || a != a) ? a : b; } };
struct EqOp { template <class A> __device__ bool operator()(A a, A b) const { return a == b; } };
struct NeOp { template <class A> __device__ bool operator()(A a, A b) const { return a != b; } };
struct LtOp { template <class A> __device__ bool operator()(A a, A b) const { return a < b; } };
struct LeOp { template <class A> __device__ bool operator()(A a, A b) const { return a <= b; } };
struct GtOp { template <class A> __device__ bool operator()(A a, A b) const { return a > b; } };
struct GeOp { template <class A> __device__ bool operator()(A a, A b) const { return a >= b; } };
struct AndOp { template <class A> __device__ bool operator()(A a, A b) const { return a != A(0) && b != A(0); } };
struct OrOp { template <class A> __device__ bool operator()(A a, A b) const { return a != A(0) || b != A(0); } };

}  // namespace weft::kernels::cuda::math
