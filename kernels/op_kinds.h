// kernels: the op enums shared by the public entry points (kernels/elementwise.h,
// kernels/reduce.h) and the backends. Kept free of includes so that nvcc-compiled CUDA files
// (cuda/*.cu), which cannot include core/tensor.h (fmt), see the same definitions.
#pragma once

namespace weft::kernels {

enum class UnaryOp {
  neg, exp, log, sqrt, rsqrt, abs, tanh, sigmoid, relu, gelu_tanh, gelu_erf, silu, sin, cos,
  square, reciprocal, sign, log1p, expm1, logical_not
};

enum class BinaryOp {
  add, sub, mul, div, pow, maximum, minimum,
  eq, ne, lt, le, gt, ge,  // comparisons give bool tensors
  logical_and, logical_or,
  // SwiGLU's element-wise part and its derivative (floats only): silu_mul(a, b) = silu(a) * b,
  // silu_grad_mul(a, b) = silu'(a) * b.
  silu_mul, silu_grad_mul
};

// sum_squares: the sum of x^2 accumulated and returned in f64 (floats only): a gradient's
// squared 2-norm without an f64 copy of it.
enum class ReduceOp { sum, mean, max, min, prod, sum_squares };

}  // namespace weft::kernels
