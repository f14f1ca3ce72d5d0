// kernels: element-wise entry points. They check operands, work out the result's shape and
// dtype, bring inputs to the compute dtype (a copy only when dtypes differ) and broadcast
// them as stride-0 views, then hand the loop to the device's backend.
#include "kernels/elementwise.h"

#include <cmath>

#include "core/copy.h"
#include "kernels/backend.h"

namespace weft::kernels {
namespace {

void check_defined(const Tensor& t, const char* op, const char* what) {
  WEFT_CHECK(t.defined(), "{}: {} is an undefined tensor", op, what);
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  WEFT_CHECK(a.device() == b.device(), "{}: tensors are on different devices: {} and {}", op,
             tensor_desc(a), tensor_desc(b));
}

// t as dtype `dt` (a copy only if it differs), broadcast to `shape`. Detached first so that
// these internal views and copies record no autograd history.
Tensor operand(const Tensor& t, DType dt, const Shape& shape) {
  if (t.dtype() == dt && t.shape() == shape) return t;
  Tensor r = t.detach();
  if (r.dtype() != dt) r = r.to(dt);
  if (r.shape() != shape) r = r.expand(shape);
  return r;
}

bool is_comparison(BinaryOp op) {
  switch (op) {
    case BinaryOp::eq: case BinaryOp::ne: case BinaryOp::lt: case BinaryOp::le: case BinaryOp::gt:
    case BinaryOp::ge: case BinaryOp::logical_and: case BinaryOp::logical_or: return true;
    default: return false;
  }
}

// Ops computed in floating point whatever the inputs: true division and SwiGLU's two.
bool float_only(BinaryOp op) {
  return op == BinaryOp::div || op == BinaryOp::silu_mul || op == BinaryOp::silu_grad_mul;
}

// A scalar that fits an integer tensor's arithmetic without turning it into f32.
bool is_integral_scalar(double s) { return std::trunc(s) == s && std::fabs(s) < 9.2e18; }
// Whether the integral scalar s is a value of the integer dtype dt.
bool fits(DType dt, double s) { return dt == DType::bool_ ? s == 0 || s == 1 : scalar_fits(s, dt); }

// Ops that integer tensors support (bool tensors only take logical_not).
bool unary_takes_integers(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: case UnaryOp::abs: case UnaryOp::relu: case UnaryOp::square: case UnaryOp::sign:
    case UnaryOp::logical_not: return true;
    default: return false;
  }
}

// Rejects expanded (stride-0) views as in-place destinations: several elements would share one memory location.
void check_no_self_overlap(const char* op, const Tensor& dst) {
  for (int64_t d = 0; d < dst.dim(); ++d)
    WEFT_CHECK(dst.stride(d) != 0 || dst.size(d) <= 1,
               "{}: destination {} has expanded dim {} (stride 0); several elements share memory",
               op, tensor_desc(dst), d);
}

}  // namespace

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::abs: return "abs";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu_tanh: return "gelu_tanh";
    case UnaryOp::gelu_erf: return "gelu_erf";
    case UnaryOp::silu: return "silu";
    case UnaryOp::sin: return "sin";
    case UnaryOp::cos: return "cos";
    case UnaryOp::square: return "square";
    case UnaryOp::reciprocal: return "reciprocal";
    case UnaryOp::sign: return "sign";
    case UnaryOp::log1p: return "log1p";
    case UnaryOp::expm1: return "expm1";
    case UnaryOp::logical_not: return "logical_not";
  }
  return "unary(?)";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::eq: return "eq";
    case BinaryOp::ne: return "ne";
    case BinaryOp::lt: return "lt";
    case BinaryOp::le: return "le";
    case BinaryOp::gt: return "gt";
    case BinaryOp::ge: return "ge";
    case BinaryOp::logical_and: return "logical_and";
    case BinaryOp::logical_or: return "logical_or";
    case BinaryOp::silu_mul: return "silu_mul";
    case BinaryOp::silu_grad_mul: return "silu_grad_mul";
  }
  return "binary(?)";
}

Tensor unary(UnaryOp op, const Tensor& x) {
  const char* name = unary_op_name(op);
  check_defined(x, name, "input");
  DType dt = x.dtype();
  if (!is_floating(dt)) {
    WEFT_CHECK(unary_takes_integers(op), "{}: needs a floating tensor (f32, f64, bf16, f16), got {}",
               name, tensor_desc(x));
    WEFT_CHECK(dt != DType::bool_ || op == UnaryOp::logical_not, "{}: not supported for bool tensor {}",
               name, tensor_desc(x));
  }
  const KernelBackend& backend = kernel_backend(x.device(), name);
  Tensor out = empty(x.shape(), {.dtype = op == UnaryOp::logical_not ? DType::bool_ : dt, .device = x.device()});
  backend.unary(op, out, x);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y) {
  const char* name = unary_op_name(op);
  check_defined(grad, name, "grad");
  WEFT_CHECK(is_floating(grad.dtype()), "{} backward: grad must be floating, got {}", name, tensor_desc(grad));
  // Only the tensor the derivative reads must be given (the other may be undefined).
  bool needs_y = op == UnaryOp::exp || op == UnaryOp::tanh || op == UnaryOp::sigmoid ||
                 op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::reciprocal;
  bool needs_x = !needs_y && op != UnaryOp::neg && op != UnaryOp::sign && op != UnaryOp::logical_not;
  Tensor v;
  if (needs_x || needs_y) {
    const Tensor& saved = needs_y ? y : x;
    check_defined(saved, name, needs_y ? "saved output y" : "saved input x");
    check_same_device(name, grad, saved);
    WEFT_CHECK(saved.shape() == grad.shape(), "{} backward: grad {} and saved {} differ in shape", name,
               tensor_desc(grad), tensor_desc(saved));
    v = operand(saved, grad.dtype(), grad.shape());
  }
  const KernelBackend& backend = kernel_backend(grad.device(), name);
  Tensor gx = empty(grad.shape(), {.dtype = grad.dtype(), .device = grad.device()});
  backend.unary_backward(op, gx, grad, needs_x ? v : Tensor(), needs_y ? v : Tensor());
  return gx;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_defined(a, name, "first operand");
  check_defined(b, name, "second operand");
  check_same_device(name, a, b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType ct = promote_types(a.dtype(), b.dtype());
  DType out_dt = is_comparison(op) ? DType::bool_ : ct;
  if (float_only(op) && !is_floating(ct)) ct = out_dt = DType::f32;
  WEFT_CHECK(!(ct == DType::bool_ && (op == BinaryOp::sub || op == BinaryOp::pow)),
             "{}: not supported for bool tensors ({} and {})", name, tensor_desc(a), tensor_desc(b));
  if (op == BinaryOp::pow && !is_floating(ct) && !b.device().is_meta())  // as with a scalar exponent
    for (double e : to_vector(b)) WEFT_CHECK(e >= 0, "pow: integer tensor {} to the negative integer power {} in {} "
                                             "(convert to float first)", tensor_desc(a), e, tensor_desc(b));
  const KernelBackend& backend = kernel_backend(a.device(), name);
  Tensor out = empty(shape, {.dtype = out_dt, .device = a.device()});
  Tensor ac = operand(a, ct, shape), bc = operand(b, ct, shape);
  backend.binary(op, out, ac, bc);
  return out;
}

Tensor binary_scalar(BinaryOp op, const Tensor& a, double s, bool scalar_first) {
  const char* name = binary_op_name(op);
  check_defined(a, name, "tensor operand");
  DType ct = a.dtype();
  if (op == BinaryOp::logical_and || op == BinaryOp::logical_or) {
    s = s != 0 ? 1 : 0;  // only truthiness matters, in any dtype
  } else if (!is_floating(ct)) {
    if (!is_integral_scalar(s) || float_only(op)) ct = DType::f32;
    else if (ct == DType::bool_ && !is_comparison(op)) ct = DType::i64;  // as torch.add: True + 1 == 2
    else if (is_comparison(op) && !fits(ct, s)) ct = DType::i64;      // u8 < 300 is true
    WEFT_CHECK(is_floating(ct) || is_comparison(op) || fits(ct, s), "{}: the scalar {} is past what {} {} holds (C++ "
               "leaves its conversion undefined): convert the tensor to a wider type or to float first", name, s,
               tensor_desc(a), dtype_name(ct));
  }
  WEFT_CHECK(!(op == BinaryOp::pow && !scalar_first && !is_floating(ct) && s < 0),
             "pow: integer tensor {} to the negative integer power {} (convert to float first)",
             tensor_desc(a), s);
  DType out_dt = is_comparison(op) ? DType::bool_ : ct;
  const KernelBackend& backend = kernel_backend(a.device(), name);
  Tensor out = empty(a.shape(), {.dtype = out_dt, .device = a.device()});
  Tensor ac = operand(a, ct, a.shape());
  backend.binary_scalar(op, out, ac, s, scalar_first);
  return out;
}

std::pair<Tensor, Tensor> swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up) {
  check_defined(grad, "swiglu_backward", "grad"), check_defined(gate, "swiglu_backward", "gate");
  check_defined(up, "swiglu_backward", "up");
  check_same_device("swiglu_backward", grad, gate), check_same_device("swiglu_backward", grad, up);
  WEFT_CHECK(grad.shape() == gate.shape() && gate.shape() == up.shape() && grad.dtype() == gate.dtype() &&
                 gate.dtype() == up.dtype() && is_floating(grad.dtype()),
             "swiglu_backward: grad {}, gate {} and up {} must share one shape and one floating dtype",
             tensor_desc(grad), tensor_desc(gate), tensor_desc(up));
  const KernelBackend& backend = kernel_backend(grad.device(), "swiglu_backward");
  const TensorOptions opts{.dtype = grad.dtype(), .device = grad.device()};
  Tensor dgate = empty(grad.shape(), opts), dup = empty(grad.shape(), opts);
  backend.swiglu_backward(grad.contiguous(), gate.contiguous(), up.contiguous(), dgate, dup);
  return {dgate, dup};
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_defined(dst, "add_", "destination");
  check_defined(src, "add_", "source");
  check_same_device("add_", dst, src);
  WEFT_CHECK(broadcast_shapes(dst.shape(), src.shape(), "add_") == dst.shape(),
             "add_: source {} cannot be broadcast to destination {}", tensor_desc(src), tensor_desc(dst));
  WEFT_CHECK(is_floating(dst.dtype()) || is_integral_scalar(alpha),
             "add_: alpha {} is not an integer but destination {} is", alpha, tensor_desc(dst));
  check_no_self_overlap("add_", dst);
  const KernelBackend& backend = kernel_backend(dst.device(), "add_");
  Tensor s = operand(src, dst.dtype(), dst.shape());
  backend.add_(dst, s, alpha);
}

void mul_scalar_(const Tensor& dst, double s) {
  check_defined(dst, "mul_scalar_", "destination");
  WEFT_CHECK(is_floating(dst.dtype()) || is_integral_scalar(s),
             "mul_scalar_: scalar {} is not an integer but destination {} is", s, tensor_desc(dst));
  check_no_self_overlap("mul_scalar_", dst);
  const KernelBackend& backend = kernel_backend(dst.device(), "mul_scalar_");
  backend.mul_scalar_(dst, s);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "condition");
  check_defined(a, "where", "first operand");
  check_defined(b, "where", "second operand");
  WEFT_CHECK(cond.dtype() == DType::bool_ || cond.dtype() == DType::u8,
             "where: condition must be bool (or u8), got {}", tensor_desc(cond));
  check_same_device("where", cond, a);
  check_same_device("where", cond, b);
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType dt = promote_types(a.dtype(), b.dtype());
  const KernelBackend& backend = kernel_backend(a.device(), "where");
  Tensor out = empty(shape, {.dtype = dt, .device = a.device()});
  Tensor c = operand(cond, cond.dtype(), shape), ac = operand(a, dt, shape), bc = operand(b, dt, shape);
  backend.where(out, c, ac, bc);
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined(x, "masked_fill", "input");
  check_defined(mask, "masked_fill", "mask");
  WEFT_CHECK(mask.dtype() == DType::bool_ || mask.dtype() == DType::u8,
             "masked_fill: mask must be bool (or u8), got {}", tensor_desc(mask));
  check_same_device("masked_fill", x, mask);
  WEFT_CHECK(scalar_fits(value, x.dtype()), "masked_fill: {} cannot hold {}", tensor_desc(x), value);
  // x and mask broadcast together, as torch.masked_fill (x [3] with a mask [2, 3] gives [2, 3]).
  const Shape shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  const KernelBackend& backend = kernel_backend(x.device(), "masked_fill");
  Tensor out = empty(shape, {.dtype = x.dtype(), .device = x.device()});
  backend.masked_fill(out, operand(x, x.dtype(), shape), operand(mask, mask.dtype(), shape), value);
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  check_defined(x, "clamp", "input");
  WEFT_CHECK(lo || hi, "clamp: at least one of min and max must be given (input {})", tensor_desc(x));
  WEFT_CHECK(!(lo && std::isnan(*lo)) && !(hi && std::isnan(*hi)), "clamp: a bound is nan (min {}, max {}) for input "
             "{}: NaN is no bound", lo ? fmt::format("{}", *lo) : "none", hi ? fmt::format("{}", *hi) : "none", tensor_desc(x));
  WEFT_CHECK(x.dtype() != DType::bool_, "clamp: not supported for bool tensor {}", tensor_desc(x));
  DType dt = x.dtype();
  if (!is_floating(dt) && ((lo && !is_integral_scalar(*lo)) || (hi && !is_integral_scalar(*hi))))
    dt = DType::f32;
  const KernelBackend& backend = kernel_backend(x.device(), "clamp");
  Tensor out = empty(x.shape(), {.dtype = dt, .device = x.device()});
  Tensor xc = operand(x, dt, x.shape());
  backend.clamp(out, xc, lo, hi);
  return out;
}

}  // namespace weft::kernels
