// Tests for kernels/elementwise: every unary op and its derivative, binary ops with
// broadcasting, type promotion and strided inputs, scalar ops, in-place updates, where,
// masked_fill, clamp, every dtype, the parallel path, and bad input.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "test_util.h"

using namespace weft;
using namespace weft::kernels;
using Catch::Contains;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using test::check_values;
using test::vec;

// Double-precision references for each unary op.
double ref_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1 / std::sqrt(x);
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return 1 / (1 + std::exp(-x));
    case UnaryOp::relu: return x > 0 ? x : 0;
    // 0.5x(1 + tanh(u)) and 0.5x(1 + erf(x/sqrt2)), in forms that keep precision for x << 0
    case UnaryOp::gelu_tanh: return x / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case UnaryOp::gelu_erf: return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    case UnaryOp::silu: return x / (1 + std::exp(-x));
    case UnaryOp::sin: return std::sin(x);
    case UnaryOp::cos: return std::cos(x);
    case UnaryOp::square: return x * x;
    case UnaryOp::reciprocal: return 1 / x;
    case UnaryOp::sign: return x > 0 ? 1 : x < 0 ? -1 : 0;
    case UnaryOp::log1p: return std::log1p(x);
    case UnaryOp::expm1: return std::expm1(x);
    case UnaryOp::logical_not: return x == 0;
  }
  return kNaN;
}

const std::vector<UnaryOp> kAllUnary = {
    UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::abs,
    UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::relu, UnaryOp::gelu_tanh, UnaryOp::gelu_erf,
    UnaryOp::silu, UnaryOp::sin, UnaryOp::cos, UnaryOp::square, UnaryOp::reciprocal, UnaryOp::sign,
    UnaryOp::log1p, UnaryOp::expm1, UnaryOp::logical_not};

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::reciprocal ||
         op == UnaryOp::log1p;
}

std::vector<double> map_ref(const std::vector<double>& xs, const std::function<double(double)>& f) {
  std::vector<double> out;
  for (double x : xs) out.push_back(f(x));
  return out;
}

// A tensor whose values are exactly representable in 16-bit floats and not too near 0.
Tensor test_input(UnaryOp op, DType dt) {
  std::vector<double> xs = positive_domain(op) ? std::vector<double>{0.125, 0.5, 1, 1.5, 2, 3.25, 7}
                                               : std::vector<double>{-3, -1.5, -0.5, 0, 0.25, 1, 2.5};
  return vec(xs, dt);
}

}  // namespace

TEST_CASE("unary ops match double references in every float dtype") {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 2e-6 : dt == kFloat16 ? 2e-3 : 1e-2;
    for (UnaryOp op : kAllUnary) {
      Tensor x = test_input(op, dt);
      Tensor y = unary(op, x);
      INFO(unary_op_name(op) << " on " << dtype_name(dt));
      CHECK(y.dtype() == (op == UnaryOp::logical_not ? kBool : dt));
      check_values(y, map_ref(to_vector(x), [op](double v) { return ref_unary(op, v); }), tol, tol);
    }
  }
}

TEST_CASE("vectorised exp, tanh, sigmoid and gelu stay accurate over their whole range") {
  std::vector<double> xs;
  for (double v = -110; v < 95; v += 0.0137) xs.push_back(v);
  Tensor x = vec(xs);
  std::vector<double> xf = to_vector(x);  // the inputs as rounded to f32
  auto close = [&](UnaryOp op, double rtol, double atol) {
    INFO(unary_op_name(op));
    // References rounded to f32 (so exp overflows to inf where f32 does).
    check_values(unary(op, x), map_ref(xf, [op](double v) { return double(float(ref_unary(op, v))); }), rtol, atol);
  };
  // Results below FLT_MIN are subnormals with fewer significant bits, hence the atol. The
  // gelu_tanh's far tail is e^-(large argument), where the argument's own f32 rounding shows.
  close(UnaryOp::exp, 3e-7, 1e-44);
  close(UnaryOp::tanh, 3e-7, 0);
  close(UnaryOp::sigmoid, 3e-7, 1e-44);
  close(UnaryOp::gelu_tanh, 2e-5, 1e-42);
  close(UnaryOp::gelu_erf, 1e-6, 1e-42);
  check_values(unary(UnaryOp::exp, vec({-kInf, kInf, kNaN, 0, -104, 88.7})), {0, kInf, kNaN, 1, 0, std::exp(double(float(88.7)))}, 3e-7);
  check_values(unary(UnaryOp::tanh, vec({-kInf, kInf, kNaN, 1e-30, -20})), {-1, 1, kNaN, 1e-30, -1});
  check_values(unary(UnaryOp::sigmoid, vec({-kInf, kInf, kNaN})), {0, 1, kNaN});
  check_values(unary(UnaryOp::relu, vec({kNaN, -0.0, -2})), {kNaN, 0, 0});
  check_values(unary(UnaryOp::sign, vec({kNaN, 0, -0.0, -2, 3})), {0, 0, 0, -1, 1});  // NaN: 0, as torch.sign
}

TEST_CASE("bf16 gelu_tanh and its gradient over the whole range, unit-stride and strided") {
  // Unit-stride bf16 runs take their own vector loop (elementwise.cpp); a strided view takes
  // the generic one. Both must be the double reference within one bf16 rounding.
  std::vector<double> xs;
  for (double v = -110; v < 95; v += 0.0137) xs.push_back(v);
  for (double v : {-kInf, kInf, kNaN, 0.0, -0.0}) xs.push_back(v);
  const int64_t n = int64_t(xs.size());  // not a multiple of 16: the run's scalar tail too
  Generator gen(11);
  Tensor x = vec(xs, kBFloat16), g = randn({n}, {.dtype = kBFloat16}, &gen);
  std::vector<double> xb = to_vector(x), gb = to_vector(g);
  // 0.5 v (1 + tanh u) = v sigmoid(2u), the form that keeps the far negative tail (e^2u).
  auto sig2u = [](double v) { return 1 / (1 + std::exp(-2 * std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); };
  auto gelu = [&](double v) { return v * sig2u(v); };
  auto gelu_grad = [&](double v) {
    const double s = sig2u(v);
    return s + 2 * v * s * (1 - s) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * v * v);
  };
  std::vector<double> want(xs.size()), want_grad(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {  // at +-inf as PyTorch: gelu inf, NaN; gradients NaN
    want[i] = std::isinf(xb[i]) ? (xb[i] > 0 ? kInf : kNaN) : gelu(xb[i]);
    want_grad[i] = std::isinf(xb[i]) ? kNaN : gb[i] * gelu_grad(xb[i]);
  }
  // Strided copies (every other element of a [n, 2] buffer) of the same values.
  Tensor x2 = zeros({n, 2}, {.dtype = kBFloat16}), g2 = zeros({n, 2}, {.dtype = kBFloat16});
  x2.select(1, 0).copy_(x);
  g2.select(1, 0).copy_(g);
  for (bool strided : {false, true}) {
    INFO((strided ? "strided" : "unit stride"));
    Tensor xi = strided ? x2.select(1, 0) : x, gi = strided ? g2.select(1, 0) : g;
    REQUIRE(xi.is_contiguous() == !strided);
    Tensor y = unary(UnaryOp::gelu_tanh, xi), gx = unary_backward(UnaryOp::gelu_tanh, gi, xi, Tensor());
    CHECK(y.dtype() == kBFloat16);
    CHECK(gx.dtype() == kBFloat16);
    check_values(y, want, 4e-3, 1e-37);
    check_values(gx, want_grad, 8e-3, 1e-37);
  }
}

TEST_CASE("bf16 silu_mul and silu_grad_mul over the whole range, unit-stride and strided") {
  // SwiGLU's element-wise ops on bf16: unit-stride operands take their own vector loop
  // (elementwise.cpp), strided ones the generic loop; both within one bf16 rounding of double.
  std::vector<double> xs;
  for (double v = -110; v < 95; v += 0.0137) xs.push_back(v);
  for (double v : {-kInf, kInf, kNaN, 0.0, -0.0}) xs.push_back(v);
  const int64_t n = int64_t(xs.size());  // not a multiple of 16: the scalar tail too
  Generator gen(12);
  Tensor a = vec(xs, kBFloat16), b = randn({n}, {.dtype = kBFloat16}, &gen);
  std::vector<double> av = to_vector(a), bv = to_vector(b), want(xs.size()), want_grad(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {  // at +-inf as PyTorch: silu(-inf) and both gradients NaN
    const double v = av[i], s = 1 / (1 + std::exp(-v));
    want[i] = std::isinf(v) ? (v > 0 ? kInf * bv[i] : kNaN) : v * s * bv[i];
    want_grad[i] = std::isinf(v) ? kNaN : (s + v * s * (1 - s)) * bv[i];
  }
  Tensor a2 = zeros({n, 2}, {.dtype = kBFloat16}), b2 = zeros({n, 2}, {.dtype = kBFloat16});
  a2.select(1, 0).copy_(a);
  b2.select(1, 0).copy_(b);
  for (bool strided : {false, true}) {
    INFO((strided ? "strided" : "unit stride"));
    Tensor ai = strided ? a2.select(1, 0) : a, bi = strided ? b2.select(1, 0) : b;
    check_values(binary(BinaryOp::silu_mul, ai, bi), want, 8e-3, 1e-37);
    check_values(binary(BinaryOp::silu_grad_mul, ai, bi), want_grad, 8e-3, 1e-37);
  }
}

namespace {

// want and got equal element for element: the same number (zeros' signs included), or NaN for NaN (a NaN's sign
// and payload are not part of a result: they differ between vectorised and scalar loops).
void check_same_values(const Tensor& want, const Tensor& got, const std::string& what) {
  const std::vector<double> a = to_vector(want), b = to_vector(got);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = std::isnan(a[i]) ? std::isnan(b[i]) : a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]);
    if (same) continue;
    INFO(what << ": element " << i << " is " << b[i] << ", want " << a[i]);
    CHECK(same);
    return;
  }
}

}  // namespace

TEST_CASE("swiglu_backward: one pass with the values of the composite's three ops, in every float dtype") {
  // d gate = silu_grad_mul(gate, grad * up), d up = silu_mul(gate, grad): the fused loop (bf16: its own vector loop)
  // must give exactly what those three ops give, tails, the whole exp range, inf and NaN included.
  std::vector<double> xs;
  for (double v = -110; v < 95; v += 0.0371) xs.push_back(v);
  for (double v : {-kInf, kInf, kNaN, 0.0, -0.0}) xs.push_back(v);
  const int64_t n = int64_t(xs.size());  // not a multiple of 16
  Generator gen(14);
  for (DType dt : {kFloat32, kFloat64, kBFloat16, DType::f16}) {
    INFO(dtype_name(dt));
    Tensor gate = vec(xs, dt), up = randn({n}, {.dtype = dt}, &gen), grad = randn({n}, {.dtype = dt}, &gen);
    const auto [dgate, dup] = swiglu_backward(grad, gate, up);
    check_same_values(binary(BinaryOp::silu_grad_mul, gate, binary(BinaryOp::mul, grad, up)), dgate, "d gate");
    check_same_values(binary(BinaryOp::silu_mul, gate, grad), dup, "d up");
    // Strided operands are read as the contiguous ones.
    Tensor g2 = zeros({n, 2}, {.dtype = dt}).select(1, 1), a2 = zeros({n, 2}, {.dtype = dt}).select(1, 0);
    g2.copy_(grad), a2.copy_(gate);
    const auto [dgate2, dup2] = swiglu_backward(g2, a2, up);
    check_same_values(dgate, dgate2, "d gate, strided");
    check_same_values(dup, dup2, "d up, strided");
  }
  Tensor x = randn({4, 8}, {}, &gen);
  CHECK_THROWS_WITH(swiglu_backward(x, x, x.narrow(1, 0, 4)), Contains("swiglu_backward: grad") && Contains("one shape"));
  CHECK_THROWS_WITH(swiglu_backward(x, x.to(kBFloat16), x), Contains("one floating dtype"));
  CHECK_THROWS_WITH(swiglu_backward(Tensor(), x, x), Contains("swiglu_backward"));
}

TEST_CASE("bf16 arithmetic: unit-stride runs give the bits of f32 arithmetic rounded once") {
  // Unit-stride bf16 runs are computed through f32 blocks with a branch-free rounding
  // (elementwise.cpp); each result must be BFloat16(f32 result) exactly: nearest even, NaN
  // kept, overflow to inf, subnormals kept.
  std::vector<double> xs = {0.0, -0.0, kNaN, kInf, -kInf, 1e-40, -3e-39, 3.3e38, -3.3e38, 1.0, 1.00390625, 1.01171875};
  Generator gen(13);
  std::vector<double> r = to_vector(randn({1000}, {}, &gen));
  for (size_t i = 0; i < r.size(); ++i) xs.push_back(r[i] * std::pow(10.0, double(int(i % 9)) - 4));
  const int64_t n = int64_t(xs.size());
  std::vector<double> ys(xs.rbegin(), xs.rend());
  Tensor a = vec(xs, kBFloat16), b = vec(ys, kBFloat16);
  std::vector<double> av = to_vector(a), bv = to_vector(b);
  auto bits = [&](const std::function<float(float, float)>& f) {
    std::vector<double> out(size_t(n), 0.0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(BFloat16(f(float(av[i]), float(bv[i]))));
    return vec(out, kBFloat16);
  };
  test::check_same_bits(bits([](float x, float y) { return x + y; }), binary(BinaryOp::add, a, b), "add");
  test::check_same_bits(bits([](float x, float y) { return x - y; }), binary(BinaryOp::sub, a, b), "sub");
  test::check_same_bits(bits([](float x, float y) { return x * y; }), binary(BinaryOp::mul, a, b), "mul");
  test::check_same_bits(bits([](float x, float y) { return x / y; }), binary(BinaryOp::div, a, b), "div");
  test::check_same_bits(bits([](float x, float) { return x * 0.3f; }), binary_scalar(BinaryOp::mul, a, 0.3), "mul 0.3");
  test::check_same_bits(bits([](float x, float) { return 2.5f - x; }), binary_scalar(BinaryOp::sub, a, 2.5, true),
                        "2.5 - a");
  Tensor d = a.clone();
  add_(d, b, 0.7);
  test::check_same_bits(bits([](float x, float y) { return x + 0.7f * y; }), d, "add_ alpha 0.7");
  mul_scalar_(d, 3.0);
  std::vector<double> dv = to_vector(bits([](float x, float y) { return x + 0.7f * y; }));
  for (double& v : dv) v = float(BFloat16(float(v) * 3.f));
  test::check_same_bits(vec(dv, kBFloat16), d, "mul_scalar_ 3");
}

TEST_CASE("integer unary ops and logical_not") {
  Tensor i = vec({-3, 0, 2, 5}, kInt64);
  check_values(unary(UnaryOp::neg, i), {3, 0, -2, -5});
  check_values(unary(UnaryOp::abs, i.to(kInt32)), {3, 0, 2, 5});
  check_values(unary(UnaryOp::sign, i), {-1, 0, 1, 1});
  check_values(unary(UnaryOp::relu, i.to(kInt32)), {0, 0, 2, 5});
  check_values(unary(UnaryOp::square, i), {9, 0, 4, 25});
  CHECK(unary(UnaryOp::square, i).dtype() == kInt64);
  check_values(unary(UnaryOp::abs, vec({0, 200, 255}, kUInt8)), {0, 200, 255});
  Tensor n = unary(UnaryOp::logical_not, vec({0, 1.5, -2, kNaN}));
  CHECK(n.dtype() == kBool);
  check_values(n, {1, 0, 0, 0});
  check_values(unary(UnaryOp::logical_not, vec({1, 0}, kBool)), {0, 1});
}

TEST_CASE("unary ops on strided views and on large tensors (parallel path)") {
  Generator gen(7);
  Tensor base = randn({300, 257}, {}, &gen);  // > 32K elements: several threads
  Tensor xt = base.t();                       // non-contiguous
  for (UnaryOp op : {UnaryOp::exp, UnaryOp::tanh, UnaryOp::abs, UnaryOp::gelu_tanh}) {
    INFO(unary_op_name(op));
    Tensor y = unary(op, xt);
    CHECK(y.shape() == Shape{257, 300});
    CHECK(y.is_contiguous());
    check_values(y, map_ref(to_vector(xt), [op](double v) { return ref_unary(op, v); }), 1e-6, 1e-6);
  }
  Tensor sliced = base.slice(1, 0, 257, 3);  // inner stride 3
  check_values(unary(UnaryOp::neg, sliced), map_ref(to_vector(sliced), [](double v) { return -v; }));
}

TEST_CASE("unary_backward matches central differences of every op") {
  Generator gen(3);
  for (DType dt : {kFloat64, kFloat32}) {
    for (UnaryOp op : kAllUnary) {
      INFO(unary_op_name(op) << " in " << dtype_name(dt));
      // Inputs away from kinks (0 for relu/abs/sign) and domain edges.
      std::vector<double> xs, gs;
      for (double u : to_vector(rand({40}, {.dtype = kFloat64}, &gen))) {
        double v = positive_domain(op) ? 0.3 + 2.7 * u : (u - 0.5) * 5;
        xs.push_back(std::fabs(v) < 0.1 ? 0.7 : v);
      }
      for (double u : to_vector(randn({40}, {.dtype = kFloat64}, &gen))) gs.push_back(u);
      Tensor x = vec(xs, dt), g = vec(gs, dt);
      Tensor y = unary(op, x);
      Tensor gx = unary_backward(op, g, x, y);
      CHECK(gx.dtype() == dt);
      std::vector<double> xr = to_vector(x), want;
      const double h = 1e-6;
      for (size_t i = 0; i < xr.size(); ++i) {
        bool flat = op == UnaryOp::sign || op == UnaryOp::logical_not;
        want.push_back(flat ? 0 : gs[i] * (ref_unary(op, xr[i] + h) - ref_unary(op, xr[i] - h)) / (2 * h));
      }
      double tol = dt == kFloat64 ? 1e-7 : 1e-5;
      check_values(gx, want, tol, tol);
    }
  }
}

TEST_CASE("unary_backward at kinks and with only the saved tensor it needs") {
  Tensor x = vec({-1, 0, 2});
  Tensor g = vec({5, 5, 5});
  check_values(unary_backward(UnaryOp::relu, g, x, unary(UnaryOp::relu, x)), {0, 0, 5});
  check_values(unary_backward(UnaryOp::abs, g, x, Tensor()), {-5, 0, 5});
  check_values(unary_backward(UnaryOp::sign, g, Tensor(), Tensor()), {0, 0, 0});
  // exp reads only y; log reads only x.
  Tensor y = unary(UnaryOp::exp, x);
  check_values(unary_backward(UnaryOp::exp, g, Tensor(), y), map_ref(to_vector(y), [](double v) { return 5 * v; }));
  CHECK_THROWS_WITH(unary_backward(UnaryOp::log, g, Tensor(), y), Contains("log") && Contains("saved input x"));
  // A bf16 gradient with f32 saved tensors: computed in the gradient's dtype.
  Tensor gb = unary_backward(UnaryOp::square, g.to(kBFloat16), x, Tensor());
  CHECK(gb.dtype() == kBFloat16);
  check_values(gb, {-10, 0, 20});
}

TEST_CASE("binary arithmetic, comparisons and logic: hand-computed values") {
  Tensor a = vec({1, -2, 3, 0.5, 0});
  Tensor b = vec({4, 2, -1.5, 0.5, 2});
  check_values(binary(BinaryOp::add, a, b), {5, 0, 1.5, 1, 2});
  check_values(binary(BinaryOp::sub, a, b), {-3, -4, 4.5, 0, -2});
  check_values(binary(BinaryOp::mul, a, b), {4, -4, -4.5, 0.25, 0});
  check_values(binary(BinaryOp::div, a, b), {0.25, -1, -2, 1, 0});
  check_values(binary(BinaryOp::pow, vec({2, 4, 9, 0}), vec({3, 0.5, -1, 0})), {8, 2, 1.0 / 9, 1});
  check_values(binary(BinaryOp::maximum, a, b), {4, 2, 3, 0.5, 2});
  check_values(binary(BinaryOp::minimum, a, b), {1, -2, -1.5, 0.5, 0});
  // NaN propagates from either side, as torch.maximum.
  check_values(binary(BinaryOp::maximum, vec({kNaN, 1}), vec({1, kNaN})), {kNaN, kNaN});
  check_values(binary(BinaryOp::minimum, vec({kNaN, 1}), vec({1, kNaN})), {kNaN, kNaN});
  struct Cmp { BinaryOp op; std::vector<double> want; };
  for (const Cmp& c : {Cmp{BinaryOp::eq, {0, 0, 0, 1, 0}}, Cmp{BinaryOp::ne, {1, 1, 1, 0, 1}},
                       Cmp{BinaryOp::lt, {1, 1, 0, 0, 1}}, Cmp{BinaryOp::le, {1, 1, 0, 1, 1}},
                       Cmp{BinaryOp::gt, {0, 0, 1, 0, 0}}, Cmp{BinaryOp::ge, {0, 0, 1, 1, 0}},
                       Cmp{BinaryOp::logical_and, {1, 1, 1, 1, 0}}, Cmp{BinaryOp::logical_or, {1, 1, 1, 1, 1}}}) {
    Tensor r = binary(c.op, a, b);
    INFO(binary_op_name(c.op));
    CHECK(r.dtype() == kBool);
    check_values(r, c.want);
  }
}

TEST_CASE("binary ops broadcast and take strided views") {
  Tensor a = arange(0, 6).view({2, 3});
  check_values(binary(BinaryOp::add, a, vec({10, 20, 30})), {10, 21, 32, 13, 24, 35});
  Tensor col = vec({1, 2}).view({2, 1}), row = vec({10, 20, 30}).view({1, 3});
  Tensor outer = binary(BinaryOp::mul, col, row);
  CHECK(outer.shape() == Shape{2, 3});
  check_values(outer, {10, 20, 30, 20, 40, 60});
  Tensor r = binary(BinaryOp::sub, arange(0, 3).view({3, 1, 1}), vec({1, 2}));
  CHECK(r.shape() == Shape{3, 1, 2});
  check_values(r, {-1, -2, 0, -1, 1, 0});
  // transposed + expanded operands, and a 0-dim operand
  Tensor at = arange(0, 6).view({3, 2}).t();  // [[0, 2, 4], [1, 3, 5]]
  check_values(binary(BinaryOp::add, at, vec({1, 2}).view({2, 1}).expand({2, 3})), {1, 3, 5, 3, 5, 7});
  check_values(binary(BinaryOp::mul, at, scalar_tensor(2)), {0, 4, 8, 2, 6, 10});
  check_values(binary(BinaryOp::div, scalar_tensor(6), vec({1, 2, 3})), {6, 3, 2});
  CHECK(binary(BinaryOp::add, scalar_tensor(1), scalar_tensor(2)).shape() == Shape{});
  // empty tensors broadcast too
  CHECK(binary(BinaryOp::add, zeros({0, 3}), vec({1, 2, 3})).shape() == Shape{0, 3});
}

TEST_CASE("binary type promotion") {
  Tensor f = vec({1.5, 2.5}), i = vec({2, 3}, kInt32), l = vec({2, 3}, kInt64);
  Tensor u = vec({250, 3}, kUInt8), bo = vec({1, 0}, kBool);
  CHECK(binary(BinaryOp::add, i, f).dtype() == kFloat32);
  check_values(binary(BinaryOp::add, i, f), {3.5, 5.5});
  CHECK(binary(BinaryOp::add, i, l).dtype() == kInt64);
  CHECK(binary(BinaryOp::mul, u, bo).dtype() == kUInt8);
  check_values(binary(BinaryOp::add, u, vec({10, 1}, kUInt8)), {4, 4});  // u8 wraps
  CHECK(binary(BinaryOp::add, vec({1}, kBFloat16), vec({1}, kFloat16)).dtype() == kFloat32);
  CHECK(binary(BinaryOp::add, vec({1}, kBFloat16), vec({1}, kFloat64)).dtype() == kFloat64);
  // integer division is true division
  Tensor q = binary(BinaryOp::div, vec({7, -7}, kInt64), vec({2, 2}, kInt64));
  CHECK(q.dtype() == kFloat32);
  check_values(q, {3.5, -3.5});
  // bool + bool is logical or, bool * bool logical and
  CHECK(binary(BinaryOp::add, bo, bo).dtype() == kBool);
  check_values(binary(BinaryOp::add, bo, vec({1, 1}, kBool)), {1, 1});
  check_values(binary(BinaryOp::mul, bo, vec({1, 1}, kBool)), {1, 0});
  // integer pow by squaring; a negative integer exponent is refused, as for a scalar one (it had truncated to 0)
  check_values(binary(BinaryOp::pow, vec({3, 2, -1, 2}, kInt64), vec({4, 0, 3, 1}, kInt64)), {81, 1, -1, 2});
  CHECK_THROWS_WITH(binary(BinaryOp::pow, vec({2, 2}, kInt64), vec({1, -1}, kInt64)),
                    Contains("pow: integer tensor i64[2] on cpu to the negative integer power -1 in i64[2]"));
  check_values(binary(BinaryOp::eq, i, l), {1, 1});
  check_values(binary(BinaryOp::lt, vec({1, 5}, kInt64), vec({1.5, 4.5})), {1, 0});
}

TEST_CASE("binary ops in every dtype") {
  for (DType dt : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kUInt8}) {
    INFO(dtype_name(dt));
    Tensor a = vec({1, 2, 6, 8}, dt), b = vec({3, 2, 2, 2}, dt);
    CHECK(binary(BinaryOp::add, a, b).dtype() == dt);
    check_values(binary(BinaryOp::add, a, b), {4, 4, 8, 10});
    check_values(binary(BinaryOp::mul, a, b), {3, 4, 12, 16});
    check_values(binary(BinaryOp::sub, a, b), dt == kUInt8 ? std::vector<double>{254, 0, 4, 6}
                                                           : std::vector<double>{-2, 0, 4, 6});
    check_values(binary(BinaryOp::div, a, b), {1.0 / 3, 1, 3, 4}, 4e-3, 0);
    check_values(binary(BinaryOp::maximum, a, b), {3, 2, 6, 8});
    check_values(binary(BinaryOp::pow, a, b), {1, 4, 36, 64});
    check_values(binary(BinaryOp::ge, a, b), {0, 1, 1, 1});
  }
}

TEST_CASE("large binary ops with mixed layouts match a double loop") {
  Generator gen(11);
  Tensor a = randn({130, 300}, {}, &gen), b = randn({300, 130}, {}, &gen);
  Tensor bt = b.t();
  std::vector<double> av = to_vector(a), bv = to_vector(bt), want(av.size());
  for (size_t i = 0; i < av.size(); ++i) want[i] = av[i] * bv[i];
  check_values(binary(BinaryOp::mul, a, bt), want);
  Tensor row = randn({300}, {}, &gen);
  std::vector<double> rv = to_vector(row);
  for (size_t i = 0; i < av.size(); ++i) want[i] = av[i] - rv[i % 300];
  check_values(binary(BinaryOp::sub, a, row), want);
  for (size_t i = 0; i < av.size(); ++i) want[i] = rv[i % 300] - av[i];
  check_values(binary(BinaryOp::sub, row, a), want);
  Tensor big = randn({70000}, {.dtype = kBFloat16}, &gen);
  std::vector<double> gv = to_vector(big), w2(gv.size());
  for (size_t i = 0; i < gv.size(); ++i) w2[i] = gv[i] + gv[i];
  check_values(binary(BinaryOp::add, big, big), w2, 1e-2, 1e-2);
}

TEST_CASE("binary_scalar: dtype rules and scalar_first") {
  Tensor f = vec({1, 2, 4});
  check_values(binary_scalar(BinaryOp::add, f, 0.5), {1.5, 2.5, 4.5});
  check_values(binary_scalar(BinaryOp::sub, f, 1, true), {0, -1, -3});
  check_values(binary_scalar(BinaryOp::div, f, 2, true), {2, 1, 0.5});
  check_values(binary_scalar(BinaryOp::pow, f, 2, true), {2, 4, 16});
  check_values(binary_scalar(BinaryOp::pow, f, 0.5), {1, std::sqrt(2.0), 2});
  check_values(binary_scalar(BinaryOp::maximum, f, 2), {2, 2, 4});
  check_values(binary_scalar(BinaryOp::lt, f, 2, true), {0, 0, 1});  // 2 < f
  Tensor c = binary_scalar(BinaryOp::gt, f, 1.5);
  CHECK(c.dtype() == kBool);
  check_values(c, {0, 1, 1});
  // bf16 keeps its dtype; the scalar is applied in f32
  Tensor hb = binary_scalar(BinaryOp::mul, vec({1, 3}, kBFloat16), 0.1);
  CHECK(hb.dtype() == kBFloat16);
  check_values(hb, {0.1, 0.3}, 1e-2);
  Tensor i = vec({1, 2, 3}, kInt32);
  CHECK(binary_scalar(BinaryOp::add, i, 2).dtype() == kInt32);
  CHECK(binary_scalar(BinaryOp::mul, i, 0.5).dtype() == kFloat32);
  check_values(binary_scalar(BinaryOp::mul, i, 0.5), {0.5, 1, 1.5});
  CHECK(binary_scalar(BinaryOp::div, i, 2).dtype() == kFloat32);
  check_values(binary_scalar(BinaryOp::div, i, 2), {0.5, 1, 1.5});
  check_values(binary_scalar(BinaryOp::pow, i, 2), {1, 4, 9});
  check_values(binary_scalar(BinaryOp::pow, i, 2, true), {2, 4, 8});
  check_values(binary_scalar(BinaryOp::lt, i, 2.5), {1, 1, 0});
  check_values(binary_scalar(BinaryOp::lt, vec({1, 255}, kUInt8), 300), {1, 1});
  Tensor bo = binary_scalar(BinaryOp::add, vec({1, 0}, kBool), 1);
  CHECK(bo.dtype() == kInt64);
  check_values(bo, {2, 1});
  check_values(binary_scalar(BinaryOp::logical_and, i, 0.5), {1, 1, 1});
  check_values(binary_scalar(BinaryOp::eq, vec({1, 0}, kBool), 2), {0, 0});
}

TEST_CASE("add_ and mul_scalar_ update in place, through views") {
  Tensor d = zeros({2, 3});
  add_(d, vec({1, 2, 3}));
  add_(d, ones({2, 3}), 0.5);
  check_values(d, {1.5, 2.5, 3.5, 1.5, 2.5, 3.5});
  // A transposed destination and an f64 source converted to f32.
  Tensor base = zeros({3, 2});
  Tensor dt = base.t();  // [2, 3] view
  add_(dt, arange(0, 6, 1, {.dtype = kFloat64}).view({2, 3}), 2.0);
  check_values(base, {0, 6, 2, 8, 4, 10});
  mul_scalar_(dt, 0.5);
  check_values(base, {0, 3, 1, 4, 2, 5});
  mul_scalar_(base.select(1, 0), -1);  // a strided column
  check_values(base, {0, 3, -1, 4, -2, 5});
  Tensor li = vec({1, 2}, kInt64);
  add_(li, vec({5, 5}, kInt64), 3);
  check_values(li, {16, 17});
  Tensor big = zeros({50000});
  add_(big, ones({1}), 2);
  CHECK(to_vector(big)[49999] == 2);
  Tensor hb = ones({4}, {.dtype = kBFloat16});
  add_(hb, vec({1, 2, 3, 4}));
  check_values(hb, {2, 3, 4, 5});
}

TEST_CASE("where, masked_fill and clamp") {
  Tensor cond = vec({1, 0, 1}, kBool);
  check_values(where(cond, vec({1, 2, 3}), vec({-1, -2, -3})), {1, -2, 3});
  Tensor w = where(vec({1, 0}, kUInt8).view({2, 1}), vec({1, 2, 3}, kInt64), scalar_tensor(0.5));
  CHECK(w.dtype() == kFloat32);
  CHECK(w.shape() == Shape{2, 3});
  check_values(w, {1, 2, 3, 0.5, 0.5, 0.5});
  Tensor at = arange(0, 6).view({3, 2}).t();
  check_values(where(binary_scalar(BinaryOp::gt, at, 2), at, zeros({1})), {0, 0, 4, 0, 3, 5});

  Tensor x = arange(0, 6).view({2, 3});
  Tensor m = vec({1, 0, 1}, kBool).view({1, 3});
  Tensor mf = masked_fill(x, m, -kInf);
  check_values(mf, {-kInf, 1, -kInf, -kInf, 4, -kInf});
  CHECK(mf.dtype() == kFloat32);
  Tensor mi = masked_fill(vec({1, 2}, kInt64), vec({0, 1}, kBool), 7);
  CHECK(mi.dtype() == kInt64);
  check_values(mi, {1, 7});
  CHECK_THROWS_WITH(masked_fill(vec({1, 2}, kInt64), vec({0, 1}, kBool), kNaN),  // had written 0
                    Contains("masked_fill: i64[2] on cpu cannot hold nan"));
  check_values(masked_fill(at, vec({1, 0}, kBool).view({2, 1}), 9), {9, 9, 9, 1, 3, 5});
  // The input and the mask broadcast together (torch.masked_fill): a larger mask gives a larger result.
  Tensor mb = masked_fill(vec({1, 2, 3}, kInt32), vec({1, 0, 1}, kBool).view({3, 1}), 0);
  CHECK(mb.shape() == Shape{3, 3});
  CHECK(mb.dtype() == kInt32);
  check_values(mb, {0, 0, 0, 1, 2, 3, 0, 0, 0});

  Tensor v = vec({-2, -0.5, 0.5, 3, kNaN});
  check_values(clamp(v, -1.0, 1.0), {-1, -0.5, 0.5, 1, kNaN});
  check_values(clamp(v, 0.0, std::nullopt), {0, 0, 0.5, 3, kNaN});
  check_values(clamp(v, std::nullopt, 0.0), {-2, -0.5, 0, 0, kNaN});
  check_values(clamp(v, 2.0, 1.0), {1, 1, 1, 1, kNaN});  // lo > hi gives hi, as torch.clamp
  Tensor ci = clamp(vec({-5, 0, 5}, kInt32), -1.0, 2.0);
  CHECK(ci.dtype() == kInt32);
  check_values(ci, {-1, 0, 2});
  CHECK(clamp(vec({-5, 0, 5}, kInt32), -0.5, std::nullopt).dtype() == kFloat32);
  check_values(clamp(vec({0, 7, 255}, kUInt8), 3.0, 1000.0), {3, 7, 255});  // bounds saturate
  check_values(clamp(vec({-5, 5}, kInt64), -1e30, 1e30), {-5, 5});
  check_values(clamp(vec({-5, 0, 5}, kBFloat16), -1.0, 2.0), {-1, 0, 2});
}

TEST_CASE("element-wise ops reject bad input with messages naming the op") {
  float buf[3] = {1, 2, 3};
  Tensor on_gpu = from_blob(buf, {3}, kFloat32, Device::cuda(0));
  Tensor a = vec({1, 2, 3});
  CHECK_THROWS_AS(binary(BinaryOp::add, a, on_gpu), weft::Error);
  CHECK_THROWS_AS(unary(UnaryOp::log, vec({1}, kInt32)), weft::Error);
  CHECK_THROWS_WITH(binary(BinaryOp::add, a, on_gpu), Contains("add") && Contains("cpu") && Contains("cuda:0"));
  if (!test::cuda_usable())  // the message depends on whether weft was built with CUDA
    CHECK_THROWS_WITH(unary(UnaryOp::exp, on_gpu), Contains("exp") && (Contains("no kernels for device cuda:0") ||
                                                                      Contains("no CUDA device is visible")));
  CHECK_THROWS_WITH(binary(BinaryOp::mul, a, vec({1, 2})), Contains("mul") && Contains("[3]") && Contains("[2]"));
  CHECK_THROWS_WITH(unary(UnaryOp::exp, vec({1, 2}, kInt64)), Contains("exp") && Contains("floating"));
  CHECK_THROWS_WITH(unary(UnaryOp::neg, vec({1}, kBool)), Contains("neg") && Contains("bool"));
  CHECK_THROWS_WITH(unary(UnaryOp::sqrt, Tensor()), Contains("sqrt") && Contains("undefined"));
  CHECK_THROWS_WITH(binary(BinaryOp::sub, vec({1}, kBool), vec({1}, kBool)), Contains("sub") && Contains("bool"));
  CHECK_THROWS_WITH(binary_scalar(BinaryOp::pow, vec({2}, kInt64), -1), Contains("pow") && Contains("negative"));
  CHECK_THROWS_WITH(where(vec({1, 0}), a, a), Contains("where") && Contains("bool"));
  CHECK_THROWS_WITH(where(vec({1, 0}, kBool), a, a), Contains("where") && Contains("[2]") && Contains("[3]"));
  CHECK_THROWS_WITH(masked_fill(a, vec({1, 0, 0, 1}, kBool).view({2, 1, 2}), 0),
                    Contains("masked_fill") && Contains("[2, 1, 2]") && Contains("[3]"));
  CHECK_THROWS_WITH(masked_fill(a, vec({1, 0, 1}), 0), Contains("masked_fill") && Contains("bool"));
  CHECK_THROWS_WITH(clamp(a, std::nullopt, std::nullopt), Contains("clamp"));
  CHECK_THROWS_WITH(add_(a.view({3, 1}).expand({3, 4}), ones({3, 4})), Contains("add_") && Contains("expanded"));
  CHECK_THROWS_WITH(add_(a, ones({2, 3})), Contains("add_") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(add_(vec({1}, kInt64), vec({1}, kInt64), 0.5), Contains("add_") && Contains("alpha"));
  CHECK_THROWS_WITH(unary_backward(UnaryOp::tanh, vec({1}, kInt64), a, a), Contains("tanh") && Contains("floating"));
  CHECK_THROWS_WITH(unary_backward(UnaryOp::exp, a, a, vec({1, 2})), Contains("exp") && Contains("shape"));
}
