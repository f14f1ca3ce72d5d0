// kernels: element-wise math with broadcasting and type promotion. Functions take tensors of any strides on one device,
// check them, allocate the result and dispatch on (device, dtype) to the backend loop (kernels/cpu now; cuda/ when
// built). 16-bit floats compute in f32. No autograd here: autograd/ops builds on these.
#pragma once
#include <optional>
#include <utility>

#include "../core/tensor.h"
#include "op_kinds.h"  // UnaryOp, BinaryOp

namespace weft::kernels {

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);

// y = op(x). Float-only ops (exp, log, ...) reject integer inputs with a clear error;
// neg/abs/sign/relu/square also take integers; logical_not gives bool.
Tensor unary(UnaryOp op, const Tensor& x);
// grad_x = grad * op'(x), using the saved output y where that is cheaper (exp, tanh, sigmoid, sqrt, rsqrt, reciprocal).
// Shapes of grad, x, y are equal. Only the tensor the derivative reads must be defined: y for the ops above, nothing
// for neg/sign/logical_not (zeros for the last two), x otherwise. relu reads x > 0, so y may be passed as x.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y);

// out = a op b with broadcasting; dtype = promote_types (bool for comparisons and logical
// ops). Both operands must be on one device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// out = a op s (or s op a when scalar_first). The tensor's dtype is kept, except that an
// integer tensor with a non-integral scalar in arithmetic gives f32 (so does div), a bool
// tensor in arithmetic gives i64, and comparisons give bool. 16-bit floats apply s in f32.
Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first = false);

// SwiGLU's backward for out = silu(gate) * up, in one pass where the backend has one: returns (d gate, d up) =
// (silu'(gate) * (grad * up), silu(gate) * grad), the values of those three binary ops (grad * up rounded to the
// dtype first; a NaN's sign may differ). grad, gate and up: one shape and one floating dtype.
std::pair<Tensor, Tensor> swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up);

// dst += alpha * src, src broadcast to dst's shape, converted to dst's dtype; dst may be
// any strided view, but must not overlap itself (no expanded dims).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);
// dst *= s in place.
void mul_scalar_(const Tensor& dst, double s);

// out = cond ? a : b, all three broadcast together; cond is bool (or u8).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// out = mask ? value : x, mask (bool) broadcast to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// out = min(max(x, lo), hi); either bound may be absent.
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);

}  // namespace weft::kernels
