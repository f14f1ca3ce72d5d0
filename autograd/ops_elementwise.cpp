// autograd: element-wise operations and their gradients. Gradients of broadcast operands
// are summed back to the operand's shape (kernels::sum_to).
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft {

using autograd::needs_grad;
using autograd::record;
using autograd::TensorList;
using kernels::BinaryOp;
using kernels::UnaryOp;
namespace k = kernels;

namespace {

Tensor mul_t(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::mul, a, b); }
Tensor scale(const Tensor& a, double s) { return s == 1.0 ? a : k::binary_scalar(BinaryOp::mul, a, s); }
// alpha * b in the result's dtype (in b's it had lost the result's precision).
Tensor scaled_to(const Tensor& a, const Tensor& b, double alpha) {
  return alpha == 1.0 ? b : scale(b.to(promote_types(a.dtype(), b.dtype())), alpha);
}
// What a backward needs to know of an input whose values it does not need.
struct InputInfo {
  Shape shape;
  bool requires_grad;
  explicit InputInfo(const Tensor& t) : shape(t.shape()), requires_grad(t.requires_grad()) {}
  Tensor reduce(const Tensor& g) const { return requires_grad ? k::sum_to(g, shape) : Tensor(); }
};

// Ops whose derivative is a function of the output alone keep only the output alive (relu's
// mask y > 0 equals x > 0), halving what the graph holds.
bool derivative_from_output(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: case UnaryOp::tanh: case UnaryOp::sigmoid: case UnaryOp::sqrt:
    case UnaryOp::rsqrt: case UnaryOp::reciprocal: case UnaryOp::relu: return true;
    default: return false;
  }
}

Tensor unary_op(UnaryOp op, const char* name, const Tensor& x) {
  Tensor y = k::unary(op, x);
  if (needs_grad({&x})) {
    Tensor saved_y = y.detach();
    Tensor saved_x = derivative_from_output(op) ? saved_y : x.detach();
    const auto node = record(name, {x}, {y}, [op, saved_x, saved_y](const TensorList& g) -> TensorList {
      return {k::unary_backward(op, g[0], saved_x, saved_y)};
    });
    if (derivative_from_output(op)) node->reads_outputs({y});
  }
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = k::binary(BinaryOp::add, a, scaled_to(a, b, alpha));
  if (needs_grad({&a, &b})) {
    record("AddBackward", {a, b}, {out}, [ia = InputInfo(a), ib = InputInfo(b), alpha](const TensorList& g) -> TensorList {
      return {ia.reduce(g[0]), ib.requires_grad ? ib.reduce(scale(g[0], alpha)) : Tensor()};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, double alpha) {
  Tensor out = k::binary(BinaryOp::sub, a, scaled_to(a, b, alpha));
  if (needs_grad({&a, &b})) {
    record("SubBackward", {a, b}, {out}, [ia = InputInfo(a), ib = InputInfo(b), alpha](const TensorList& g) -> TensorList {
      return {ia.reduce(g[0]), ib.requires_grad ? ib.reduce(scale(g[0], -alpha)) : Tensor()};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = mul_t(a, b);
  if (needs_grad({&a, &b})) {
    // Save each operand only if the other one needs its gradient.
    Tensor sa = b.requires_grad() ? a.detach() : Tensor(), sb = a.requires_grad() ? b.detach() : Tensor();
    record("MulBackward", {a, b}, {out}, [sa, sb, ash = a.shape(), bsh = b.shape()](const TensorList& g) -> TensorList {
      return {sb.defined() ? k::sum_to(mul_t(g[0], sb), ash) : Tensor(),
              sa.defined() ? k::sum_to(mul_t(g[0], sa), bsh) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = k::binary(BinaryOp::div, a, b);
  if (needs_grad({&a, &b})) {
    const auto node = record("DivBackward", {a, b}, {out},
           [ia = InputInfo(a), b = b.detach(), out = out.detach(), rb = b.requires_grad()](
               const TensorList& g) -> TensorList {
             Tensor ga = k::binary(BinaryOp::div, g[0], b);
             Tensor gb;
             if (rb) gb = k::sum_to(k::unary(UnaryOp::neg, k::binary(BinaryOp::mul, ga, out)), b.shape());
             return {ia.reduce(ga), gb};
           });
    if (b.requires_grad()) node->reads_outputs({out});
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = k::binary(BinaryOp::pow, a, b);
  if (needs_grad({&a, &b})) {
    const auto node = record("PowBackward", {a, b}, {out},
           [a = a.detach(), b = b.detach(), out = out.detach(), ra = a.requires_grad(), rb = b.requires_grad()](
               const TensorList& g) -> TensorList {
             Tensor ga, gb;
             if (ra) {  // b * a^(b-1), 0 where b == 0 (0 * inf at a == 0), as PyTorch
               Tensor d = mul_t(b, k::binary(BinaryOp::pow, a, k::binary_scalar(BinaryOp::sub, b, 1.0)));
               d = k::masked_fill(d, k::binary_scalar(BinaryOp::eq, b, 0.0), 0.0);
               ga = k::sum_to(mul_t(g[0], d), a.shape());
             }
             if (rb) {  // out * log(a), taken as 0 where a == 0 and b >= 0 (the limit), as PyTorch
               Tensor d = mul_t(out, k::unary(UnaryOp::log, a));
               d = k::masked_fill(d, k::binary(BinaryOp::logical_and, k::binary_scalar(BinaryOp::eq, a, 0.0),
                                               k::binary_scalar(BinaryOp::ge, b, 0.0)), 0.0);
               gb = k::sum_to(mul_t(g[0], d), b.shape());
             }
             return {ga, gb};
           });
    if (b.requires_grad()) node->reads_outputs({out});
  }
  return out;
}

Tensor pow(const Tensor& a, double e) {
  Tensor out = k::binary_scalar(BinaryOp::pow, a, e);
  if (needs_grad({&a})) {
    record("PowBackward", {a}, {out}, [a = a.detach(), e](const TensorList& g) -> TensorList {
      if (e == 0.0) return {zeros_like(g[0])};
      Tensor d = scale(k::binary_scalar(BinaryOp::pow, a, e - 1.0), e);
      return {mul_t(g[0], d)};
    });
  }
  return out;
}

Tensor pow(double base, const Tensor& e) {  // the gradient is that of pow(Tensor, Tensor) above
  return pow(full({}, base, {.dtype = is_floating(e.dtype()) ? e.dtype() : kFloat32, .device = e.device()}), e);
}

namespace {
// torch.maximum/minimum: the gradient goes to the chosen operand, split in half on ties.
Tensor extremum(BinaryOp op, BinaryOp wins, const char* name, const Tensor& a, const Tensor& b) {
  Tensor out = k::binary(op, a, b);
  if (needs_grad({&a, &b})) {
    record(name, {a, b}, {out}, [a = a.detach(), b = b.detach(), wins, ra = a.requires_grad(),
                                 rb = b.requires_grad()](const TensorList& g) -> TensorList {
      // Each side's share: half on a tie, else all unless the other side wins (a NaN gives both all, as PyTorch).
      const Tensor tie = k::binary(BinaryOp::eq, a, b), half = scalar_tensor(0.5, {.dtype = g[0].dtype()});
      auto share = [&](const Tensor& x, const Tensor& y) {
        return k::where(tie, half, k::binary_scalar(BinaryOp::eq, k::binary(wins, y, x), 0.0).to(g[0].dtype()));
      };
      Tensor ga = ra ? k::sum_to(mul_t(g[0], share(a, b)), a.shape()) : Tensor();
      Tensor gb = rb ? k::sum_to(mul_t(g[0], share(b, a)), b.shape()) : Tensor();
      return {ga, gb};
    });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::maximum, BinaryOp::gt, "MaximumBackward", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::minimum, BinaryOp::lt, "MinimumBackward", a, b); }

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::neg, "NegBackward", x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::exp, "ExpBackward", x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::log, "LogBackward", x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::sqrt, "SqrtBackward", x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::rsqrt, "RsqrtBackward", x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::abs, "AbsBackward", x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::tanh, "TanhBackward", x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::sigmoid, "SigmoidBackward", x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::relu, "ReluBackward", x); }
Tensor sin(const Tensor& x) { return unary_op(UnaryOp::sin, "SinBackward", x); }
Tensor cos(const Tensor& x) { return unary_op(UnaryOp::cos, "CosBackward", x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::square, "SquareBackward", x); }
Tensor reciprocal(const Tensor& x) { return unary_op(UnaryOp::reciprocal, "ReciprocalBackward", x); }
Tensor sign(const Tensor& x) { return unary_op(UnaryOp::sign, "SignBackward", x); }  // a zero gradient, as torch

Tensor gelu(const Tensor& x, std::string_view approximate) {
  WEFT_CHECK(approximate == "none" || approximate == "tanh",
             "gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  return approximate == "tanh" ? unary_op(UnaryOp::gelu_tanh, "GeluBackward", x)
                               : unary_op(UnaryOp::gelu_erf, "GeluBackward", x);
}

Tensor silu(const Tensor& x) { return unary_op(UnaryOp::silu, "SiluBackward", x); }

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = k::binary(BinaryOp::silu_mul, gate, up);
  if (needs_grad({&gate, &up})) {
    record("SwigluBackward", {gate, up}, {out},
           [a = gate.detach(), b = up.detach(), ia = InputInfo(gate), ib = InputInfo(up)](const TensorList& g)
               -> TensorList {
             // d gate = g * up * silu'(gate), d up = g * silu(gate): one pass where no input was broadcast.
             const bool same_shape = a.shape() == g[0].shape() && b.shape() == a.shape();
             if (same_shape && a.dtype() == g[0].dtype() && b.dtype() == a.dtype()) {
               auto [ga, gb] = k::swiglu_backward(g[0], a, b);
               return {ia.requires_grad ? ga : Tensor(), ib.requires_grad ? gb : Tensor()};
             }
             Tensor ga = ia.requires_grad ? ia.reduce(k::binary(BinaryOp::silu_grad_mul, a, mul_t(g[0], b))) : Tensor();
             Tensor gb = ib.requires_grad ? ib.reduce(k::binary(BinaryOp::silu_mul, a, g[0])) : Tensor();
             return {ga, gb};
           });
  }
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  Tensor out = k::clamp(x, lo, hi);
  if (needs_grad({&x})) {
    record("ClampBackward", {x}, {out}, [x = x.detach(), lo, hi](const TensorList& g) -> TensorList {
      // Gradient passes where lo < x < hi (not at a bound, as torch.clamp since 2.x; 1.13 passed it there); not at NaN.
      Tensor outside = k::binary(BinaryOp::ne, x, x);
      if (lo) outside = k::binary(BinaryOp::logical_or, outside, k::binary_scalar(BinaryOp::le, x, *lo));
      if (hi) outside = k::binary(BinaryOp::logical_or, outside, k::binary_scalar(BinaryOp::ge, x, *hi));
      return {k::masked_fill(g[0], outside, 0.0)};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = k::where(cond, a, b);
  if (needs_grad({&a, &b})) {
    record("WhereBackward", {a, b}, {out}, [cond = cond.detach(), ia = InputInfo(a), ib = InputInfo(b)](const TensorList& g) -> TensorList {
      Tensor z = scalar_tensor(0.0, {.dtype = g[0].dtype(), .device = g[0].device()});
      return {ia.requires_grad ? ia.reduce(k::where(cond, g[0], z)) : Tensor(),
              ib.requires_grad ? ib.reduce(k::where(cond, z, g[0])) : Tensor()};
    });
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = k::masked_fill(x, mask, value);
  if (needs_grad({&x})) {
    record("MaskedFillBackward", {x}, {out}, [mask = mask.detach(), ix = InputInfo(x)](const TensorList& g) -> TensorList {
      return {ix.reduce(k::masked_fill(g[0], mask, 0.0))};  // summed over the dims a larger mask broadcast x along
    });
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return k::binary(BinaryOp::ge, a, b); }

// ---- operators. A scalar operand keeps the tensor's dtype (a f32 tensor times 0.5 stays f32).
namespace {
Tensor scalar_op(BinaryOp op, const char* name, const Tensor& a, double s, bool scalar_first) {
  Tensor out = k::binary_scalar(op, a, s, scalar_first);
  if (needs_grad({&a})) {
    const auto node = record(name, {a}, {out}, [op, s, scalar_first, a = a.detach(), out = out.detach()](const TensorList& g) -> TensorList {
      switch (op) {
        case BinaryOp::add: return {g[0]};
        case BinaryOp::sub: return {scalar_first ? k::unary(UnaryOp::neg, g[0]) : g[0]};
        case BinaryOp::mul: return {scale(g[0], s)};
        default:  // div
          if (!scalar_first) return {scale(g[0], 1.0 / s)};
          // d(s / a) = -s / a^2 = -out / a
          return {k::unary(UnaryOp::neg, k::binary(BinaryOp::div, mul_t(g[0], out), a))};
      }
    });
    if (op == BinaryOp::div && scalar_first) node->reads_outputs({out});  // d(s / a) = -out / a
  }
  return out;
}
}  // namespace

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double s) { return scalar_op(BinaryOp::add, "AddBackward", a, s, false); }
Tensor operator-(const Tensor& a, double s) { return scalar_op(BinaryOp::sub, "SubBackward", a, s, false); }
Tensor operator*(const Tensor& a, double s) { return scalar_op(BinaryOp::mul, "MulBackward", a, s, false); }
Tensor operator/(const Tensor& a, double s) { return scalar_op(BinaryOp::div, "DivBackward", a, s, false); }
Tensor operator+(double s, const Tensor& a) { return scalar_op(BinaryOp::add, "AddBackward", a, s, true); }
Tensor operator-(double s, const Tensor& a) { return scalar_op(BinaryOp::sub, "SubBackward", a, s, true); }
Tensor operator*(double s, const Tensor& a) { return scalar_op(BinaryOp::mul, "MulBackward", a, s, true); }
Tensor operator/(double s, const Tensor& a) { return scalar_op(BinaryOp::div, "DivBackward", a, s, true); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator==(const Tensor& a, double s) { return k::binary_scalar(BinaryOp::eq, a, s); }
Tensor operator<(const Tensor& a, double s) { return k::binary_scalar(BinaryOp::lt, a, s); }
Tensor operator>(const Tensor& a, double s) { return k::binary_scalar(BinaryOp::gt, a, s); }

}  // namespace weft
