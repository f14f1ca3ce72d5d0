// Every differentiable op against finite differences (autograd::gradcheck, f64), on several
// shapes, with broadcasting and with non-contiguous views as inputs.
#include <catch2/catch.hpp>

#include "weft.h"

using namespace weft;
using autograd::gradcheck;
using autograd::TensorList;

namespace {
Generator gen(7);
Tensor leaf(const Shape& shape, double lo = -1, double hi = 1) {
  Tensor t = empty(shape, {.dtype = kFloat64});
  t.uniform_(lo, hi, &gen);
  return t.set_requires_grad();
}
// Values bounded away from 0 (for log, sqrt, division, pow).
Tensor positive(const Shape& shape) { return leaf(shape, 0.5, 2.0); }

void expect_ok(const std::function<Tensor(const TensorList&)>& fn, const TensorList& in) {
  auto r = gradcheck(fn, in);
  INFO(r.message);
  CHECK(r.ok);
}
}  // namespace

TEST_CASE("gradcheck: binary arithmetic with broadcasting") {
  Tensor a = leaf({3, 4}), b = leaf({4}), c = leaf({3, 1}), p = positive({3, 4}), q = positive({1, 4});
  expect_ok([](const TensorList& x) { return add(x[0], x[1], 0.5); }, {a, b});
  expect_ok([](const TensorList& x) { return sub(x[0], x[1], 2.0); }, {a, c});
  expect_ok([](const TensorList& x) { return x[0] * x[1]; }, {a, c});
  expect_ok([](const TensorList& x) { return x[0] / x[1]; }, {a, q});
  expect_ok([](const TensorList& x) { return pow(x[0], x[1]); }, {p, q});
  expect_ok([](const TensorList& x) { return pow(x[0], 3.0); }, {a});
  expect_ok([](const TensorList& x) { return pow(x[0], -1.5); }, {p});
  expect_ok([](const TensorList& x) { return pow(2.0, x[0]); }, {a});
  expect_ok([](const TensorList& x) { return maximum(x[0], x[1]); }, {a, b});
  expect_ok([](const TensorList& x) { return minimum(x[0], x[1]); }, {a, c});
  // Non-contiguous operands: a transposed view and an expanded one.
  Tensor t = leaf({4, 3});
  expect_ok([](const TensorList& x) { return x[0].t() * x[1]; }, {t, a});
  expect_ok([](const TensorList& x) { return x[0] + x[1].unsqueeze(0).expand({3, 4}); }, {a, b});
}

TEST_CASE("gradcheck: scalar operators") {
  Tensor a = leaf({2, 3}), p = positive({2, 3});
  expect_ok([](const TensorList& x) { return x[0] * 3.0 + 1.0; }, {a});
  expect_ok([](const TensorList& x) { return 2.0 - x[0] / 4.0; }, {a});
  expect_ok([](const TensorList& x) { return 3.0 / x[0]; }, {p});
  expect_ok([](const TensorList& x) { return -x[0] - 1.0; }, {a});
}

TEST_CASE("gradcheck: unary functions") {
  Tensor a = leaf({2, 5}), p = positive({2, 5});
  // Keep relu/abs/clamp inputs away from their kinks.
  Tensor k = from_vector({-0.9, -0.5, 0.3, 0.7, 1.2, -1.3}, {2, 3}, {.dtype = kFloat64}).set_requires_grad();
  expect_ok([](const TensorList& x) { return neg(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return exp(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return log(x[0]); }, {p});
  expect_ok([](const TensorList& x) { return sqrt(x[0]); }, {p});
  expect_ok([](const TensorList& x) { return rsqrt(x[0]); }, {p});
  expect_ok([](const TensorList& x) { return abs(x[0]); }, {k});
  expect_ok([](const TensorList& x) { return tanh(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return sigmoid(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return relu(x[0]); }, {k});
  expect_ok([](const TensorList& x) { return gelu(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return gelu(x[0], "tanh"); }, {a});
  expect_ok([](const TensorList& x) { return silu(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return swiglu(x[0], x[1]); }, {a, p});
  expect_ok([](const TensorList& x) { return swiglu(x[0], x[1].narrow(0, 0, 1)); }, {a, p});  // broadcast up
  expect_ok([](const TensorList& x) { return sin(x[0]) + cos(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return square(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return reciprocal(x[0]); }, {p});
  expect_ok([](const TensorList& x) { return clamp(x[0], -0.6, 0.8); }, {k});
  expect_ok([](const TensorList& x) { return clamp(x[0], std::nullopt, 0.5); }, {k});
  expect_ok([](const TensorList& x) { return tanh(x[0].t()); }, {a});  // strided input
}

TEST_CASE("gradcheck: where and masked_fill") {
  Tensor a = leaf({3, 4}), b = leaf({4});
  Tensor cond = from_vector({1, 0, 0, 1}, {4}).to(kBool);
  expect_ok([&](const TensorList& x) { return where(cond, x[0], x[1]); }, {a, b});
  expect_ok([&](const TensorList& x) { return masked_fill(x[0], cond, -5.0); }, {a});
  // A mask larger than the input broadcasts both (torch.masked_fill): b's gradient sums over the new dim.
  Tensor wide = from_vector({1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0}, {3, 4}).to(kBool);
  expect_ok([&](const TensorList& x) { return masked_fill(x[0], wide, -5.0); }, {b});
  Tensor v = from_vector({1, 2, 3}, {3}).set_requires_grad();
  Tensor y = masked_fill(v, from_vector({1, 0, 0, 0, 1, 0}, {2, 3}).to(kBool), -5.0);
  CHECK(y.shape() == Shape{2, 3});
  CHECK(to_vector(y) == std::vector<double>{-5, 2, 3, 1, -5, 3});
  y.backward(arange(0, 6).view({2, 3}));
  CHECK(to_vector(v.grad()) == std::vector<double>{3, 1, 7});  // torch's
}

TEST_CASE("gradcheck: reductions") {
  Tensor a = leaf({3, 4, 2});
  expect_ok([](const TensorList& x) { return sum(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return sum(x[0], {1}); }, {a});
  expect_ok([](const TensorList& x) { return sum(x[0], {0, 2}, true); }, {a});
  expect_ok([](const TensorList& x) { return mean(x[0], {-1}); }, {a});
  expect_ok([](const TensorList& x) { return mean(x[0].transpose(0, 2), {0}); }, {a});
  expect_ok([](const TensorList& x) { return var(x[0], {1}); }, {a});
  expect_ok([](const TensorList& x) { return var(x[0], {}, 0, true); }, {a});
  expect_ok([](const TensorList& x) { return max(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return min(x[0]); }, {a});
  expect_ok([](const TensorList& x) { return max(x[0], 1).first; }, {a});
  expect_ok([](const TensorList& x) { return min(x[0], -1, true).first; }, {a});
  // correction >= n: the forward divides by 0 (inf), so does the gradient (2 / (n - correction) had been finite)
  Tensor two = from_vector({1, 2}, {2}).set_requires_grad();
  var(two, {}, 3).backward();
  CHECK(to_vector(two.grad()) == std::vector<double>{-INFINITY, INFINITY});
}

TEST_CASE("gradcheck: matmul shapes and linear") {
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({3, 4}), leaf({4, 5})});
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({4}), leaf({4})});
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({4}), leaf({4, 2})});
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({3, 4}), leaf({4})});
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({2, 3, 4}), leaf({4, 5})});
  expect_ok([](const TensorList& x) { return matmul(x[0], x[1]); }, {leaf({2, 1, 3, 4}), leaf({5, 4, 2})});
  expect_ok([](const TensorList& x) { return matmul(x[0].t(), x[1].t()); }, {leaf({4, 3}), leaf({5, 4})});
  expect_ok([](const TensorList& x) { return linear(x[0], x[1], x[2]); }, {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})});
  expect_ok([](const TensorList& x) { return linear(x[0], x[1]); }, {leaf({3, 4}), leaf({2, 4})});
}

TEST_CASE("gradcheck: low_rank_linear with the adapter reading x itself or an input of its own") {
  // x [2, 3, 4], W [5, 4], bias [5], A [2, 4], B [5, 2]. Reading x itself, x's gradient sums
  // the base's and the adapter's products in one buffer.
  expect_ok([](const TensorList& x) { return low_rank_linear(x[0], x[0], x[1], x[2], x[3], x[4], 1.5); },
            {leaf({2, 3, 4}), leaf({5, 4}), leaf({5}), leaf({2, 4}), leaf({5, 2})});
  expect_ok([](const TensorList& x) { return low_rank_linear(x[0], x[5], x[1], {}, x[3], x[4], 0.5); },
            {leaf({3, 4}), leaf({5, 4}), leaf({5}), leaf({2, 4}), leaf({5, 2}), leaf({3, 4})});
}

TEST_CASE("gradcheck: softmax, log_softmax, layer_norm and rms_norm") {
  Tensor a = leaf({3, 5});
  expect_ok([](const TensorList& x) { return softmax(x[0], -1); }, {a});
  expect_ok([](const TensorList& x) { return softmax(x[0], 0); }, {a});
  expect_ok([](const TensorList& x) { return log_softmax(x[0], 1); }, {a});
  expect_ok([](const TensorList& x) { return log_softmax(x[0].t(), -1); }, {a});
  expect_ok([](const TensorList& x) { return layer_norm(x[0], {5}, x[1], x[2]); }, {leaf({2, 3, 5}), leaf({5}), leaf({5})});
  expect_ok([](const TensorList& x) { return layer_norm(x[0], {3, 5}); }, {leaf({2, 3, 5})});
  expect_ok([](const TensorList& x) { return rms_norm(x[0], {5}, x[1]); }, {leaf({2, 3, 5}), leaf({5})});
  expect_ok([](const TensorList& x) { return rms_norm(x[0], {3, 5}, {}, 0.1); }, {leaf({2, 3, 5})});
}

TEST_CASE("gradcheck: embedding, index_select, gather, scatter_add") {
  Tensor idx = from_vector({0, 2, 2, 1}, {2, 2}, {.dtype = kInt64});
  expect_ok([&](const TensorList& x) { return embedding(x[0], idx); }, {leaf({3, 4})});
  Tensor i1 = from_vector({2, 0, 2}, {3}, {.dtype = kInt64});
  expect_ok([&](const TensorList& x) { return index_select(x[0], 1, i1); }, {leaf({2, 4})});
  Tensor gi = from_vector({0, 1, 1, 0, 2, 2}, {2, 3}, {.dtype = kInt64});
  expect_ok([&](const TensorList& x) { return gather(x[0], 1, gi); }, {leaf({2, 4})});
  expect_ok([&](const TensorList& x) { return scatter_add(x[0], 1, gi, x[1]); }, {leaf({2, 4}), leaf({2, 3})});
}

TEST_CASE("gradcheck: cross_entropy with ignore_index, label smoothing and reductions") {
  Tensor logits = leaf({4, 5});
  Tensor target = from_vector({1, 4, -100, 0}, {4}, {.dtype = kInt64});
  expect_ok([&](const TensorList& x) { return cross_entropy(x[0], target); }, {logits});
  expect_ok([&](const TensorList& x) { return cross_entropy(x[0], target, {.reduction = "sum"}); }, {logits});
  expect_ok([&](const TensorList& x) { return cross_entropy(x[0], target, {.reduction = "none"}); }, {logits});
  expect_ok([&](const TensorList& x) { return cross_entropy(x[0], target, {.label_smoothing = 0.1}); }, {logits});
}

TEST_CASE("gradcheck: cat, stack and views") {
  expect_ok([](const TensorList& x) { return cat({x[0], x[1]}, 1); }, {leaf({2, 3}), leaf({2, 2})});
  expect_ok([](const TensorList& x) { return stack({x[0], x[1]}, 0); }, {leaf({2, 3}), leaf({2, 3})});
  Tensor a = leaf({4, 6});
  expect_ok([](const TensorList& x) { return x[0].view({2, 12}) * 2.0; }, {a});
  expect_ok([](const TensorList& x) { return x[0].t().reshape({-1}) * 2.0; }, {a});
  expect_ok([](const TensorList& x) { return x[0].narrow(1, 2, 3) * sum(x[0].slice(0, 0, 4, 2).narrow(1, 0, 3)); }, {a});
  expect_ok([](const TensorList& x) { return x[0].permute({1, 0}).select(0, 3) * 1.0; }, {a});
  expect_ok([](const TensorList& x) { auto c = x[0].chunk(3, 1); return c[0] * c[2]; }, {a});
  expect_ok([](const TensorList& x) { return x[0].unsqueeze(1).expand({4, 3, 6}).squeeze(0) * 1.0; }, {a});
  expect_ok([](const TensorList& x) { return x[0].flatten() * x[0].flatten(); }, {a});
  // as_strided windows that overlap (a sliding window's), broadcast (stride 0) and start past the base's first element.
  Tensor b = leaf({7});
  expect_ok([](const TensorList& x) { return x[0].as_strided({3, 3}, {1, 1}, 0) * x[0].as_strided({3, 3}, {2, 0}, 1); }, {b});
  Tensor c = arange(0, 4, 1, {.dtype = kFloat64}).set_requires_grad();
  sum(c.as_strided({3, 2}, {1, 1}, 0)).backward();
  CHECK(to_vector(c.grad()) == std::vector<double>{1, 2, 2, 1});
  // A window outside its base (storage offset 0 of a view that starts at 5) is refused where it is taken, naming it
  // (its backward had failed in index_add, naming index -5).
  Tensor d = arange(0, 10, 1, {.dtype = kFloat64}).set_requires_grad();
  CHECK_THROWS_WITH(d.narrow(0, 5, 5).as_strided({3}, {1}, 0),
                    Catch::Contains("as_strided: the view reaches offsets -5 to -3 of its base f64[5]") &&
                        Catch::Contains("outside its 5 elements"));
}

TEST_CASE("gradcheck: dropout with a fixed mask") {
  Tensor a = leaf({4, 5});
  expect_ok([](const TensorList& x) {
    Generator g(3);  // same mask on every evaluation
    return dropout(x[0], 0.3, true, &g);
  }, {a});
}

TEST_CASE("gradcheck: conv2d and max_pool2d") {
  expect_ok([](const TensorList& x) { return conv2d(x[0], x[1], x[2], 1, 1); },
            {leaf({2, 2, 5, 5}), leaf({3, 2, 3, 3}), leaf({3})});
  expect_ok([](const TensorList& x) { return conv2d(x[0], x[1], {}, 2, 0); }, {leaf({1, 1, 6, 5}), leaf({2, 1, 2, 2})});
  // Distinct values so the max is unique and the pooling is differentiable everywhere tested.
  Tensor img = (arange(0, 2 * 16, 1, {.dtype = kFloat64}).reshape({1, 2, 4, 4}) * 0.37).detach();
  img = (sin(img) * 3.0).detach().set_requires_grad();
  expect_ok([](const TensorList& x) { return max_pool2d(x[0], 2); }, {img});
  expect_ok([](const TensorList& x) { return max_pool2d(x[0], 3, 1, 1); }, {img});
  // Only -1 stands for the default stride (the window's size); another negative one is refused, as nn::MaxPool2d does.
  CHECK_THROWS_WITH(max_pool2d(img, 2, -5), Catch::Contains("max_pool2d") && Catch::Contains("stride -5"));
}

TEST_CASE("gradcheck names its bad arguments") {
  using Catch::Contains;
  auto id = [](const TensorList& in) { return in[0] * 2.0; };
  CHECK_THROWS_WITH(gradcheck(id, {Tensor()}), Contains("gradcheck: input 0 is an undefined tensor"));
  CHECK_THROWS_WITH(gradcheck(id, {leaf({2}).to(kFloat32)}), Contains("gradcheck: inputs must be f64"));
  CHECK_THROWS_WITH(gradcheck(id, {leaf({2})}, {.eps = 0}), Contains("eps must be a finite number > 0, got 0"));
  CHECK_THROWS_WITH(gradcheck([](const TensorList&) { return Tensor(); }, {leaf({2})}),
                    Contains("gradcheck: the function returned an undefined tensor"));
}

// The exponent's gradient at base 0 (out * log 0): 0 where e >= 0, as PyTorch takes it, for a
// scalar base as for a tensor one; -inf where e < 0 (out is inf there).
TEST_CASE("pow's exponent gradient at base 0") {
  for (bool scalar_base : {true, false}) {
    INFO("scalar base " << scalar_base);
    Tensor e = from_vector({0, 1, 2, -1}, {4});
    e.set_requires_grad(true);
    sum(scalar_base ? pow(0.0, e) : pow(zeros({4}), e)).backward();
    const std::vector<double> g = to_vector(e.grad());
    CHECK((g[0] == 0 && g[1] == 0 && g[2] == 0));
    CHECK(g[3] == -std::numeric_limits<double>::infinity());
  }
}

// Edge values as PyTorch takes them (each had differed): pow's base gradient at b == 0 (0, not 0 * inf); a NaN in
// max/min over all elements takes the gradient, maximum/minimum give it to both sides of a NaN, relu passes it at a
// NaN and clamp does not; max over dim 0 of a 0-d tensor; alpha * b in the result's dtype.
TEST_CASE("gradients at NaN, at 0 ** 0 and of 0-d reductions, as PyTorch") {
  auto grad_of = [](const std::vector<double>& v, const std::function<Tensor(const Tensor&)>& f) {
    Tensor x = from_vector(v, {int64_t(v.size())}, {.dtype = kFloat64});
    x.set_requires_grad(true);
    sum(f(x)).backward();
    return to_vector(x.grad());
  };
  const double nan = std::nan("");
  Tensor b = from_vector({0.0, 0.5, 0.0}, {3}, {.dtype = kFloat64});
  auto pa = grad_of({0, 0, 2}, [&](const Tensor& a) { return pow(a, b); });
  CHECK((pa[0] == 0 && std::isinf(pa[1]) && pa[2] == 0));
  CHECK(grad_of({1, nan, 3}, [](const Tensor& x) { return max(x); }) == std::vector<double>{0, 1, 0});
  CHECK(grad_of({1, nan, 3}, [](const Tensor& x) { return min(x); }) == std::vector<double>{0, 1, 0});
  Tensor other = from_vector({1.0, nan, 2.0}, {3}, {.dtype = kFloat64});
  other.set_requires_grad(true);
  Tensor mine = from_vector({nan, 1.0, 2.0}, {3}, {.dtype = kFloat64});
  mine.set_requires_grad(true);
  sum(maximum(mine, other)).backward();
  CHECK(to_vector(mine.grad()) == std::vector<double>{1, 1, 0.5});
  CHECK(to_vector(other.grad()) == std::vector<double>{1, 1, 0.5});
  CHECK(grad_of({nan, -1, 2}, [](const Tensor& x) { return relu(x); }) == std::vector<double>{1, 0, 1});
  CHECK(grad_of({nan, 0.5, 2}, [](const Tensor& x) { return clamp(x, 0.0, 1.0); }) == std::vector<double>{0, 1, 0});
  // At a bound, none (torch.clamp 2.15 with number bounds: [0, 0, 1, 0, 0]; 1.13 passed it on the closed interval).
  CHECK(grad_of({-1, 0, 0.5, 1, 2}, [](const Tensor& x) { return clamp(x, 0.0, 1.0); }) ==
        std::vector<double>{0, 0, 1, 0, 0});
  CHECK(grad_of({-1, 0, 0.5, 1, 2}, [](const Tensor& x) { return clamp(x, 0.0, std::nullopt); }) ==
        std::vector<double>{0, 0, 1, 1, 1});
  CHECK(grad_of({nan, -2, 0}, [](const Tensor& x) { return sign(x); }) == std::vector<double>{0, 0, 0});
  CHECK(to_vector(sign(from_vector({NAN, -2, 0, 3}, {4}))) == std::vector<double>{0, -1, 0, 1});
  Tensor s = scalar_tensor(2.0, {.dtype = kFloat64});
  s.set_requires_grad(true);
  max(s, 0).first.backward();
  CHECK(s.grad().item() == 1);
  Tensor f32 = from_vector({1.0}, {1}), bf = from_vector({-0.8046875}, {1}, {.dtype = kBFloat16});
  CHECK(add(f32, bf, 1.0 / 3).item() == Approx(1.0f - 0.8046875f / 3).epsilon(1e-7));
  CHECK(sub(f32, bf, 1.0 / 3).item() == Approx(1.0f + 0.8046875f / 3).epsilon(1e-7));
}

// An integral scalar in an integer tensor's arithmetic must be a number its dtype holds (i32 * 3e9 had wrapped).
TEST_CASE("integer arithmetic with a scalar past the dtype's range is an error") {
  const Tensor i = from_vector({1, 2, -3}, {3}, {.dtype = kInt32});
  CHECK_THROWS_WITH(i * 3e9, Catch::Contains("mul: the scalar 3000000000 is past what i32[3] on cpu i32 holds"));
  CHECK_THROWS_WITH(i - 1e10, Catch::Contains("the scalar 10000000000 is past what"));
  CHECK(to_vector(i * 2.5) == std::vector<double>{2.5, 5, -7.5});  // a non-integral scalar: f32
  CHECK(to_vector(i < 3e9) == std::vector<double>{1, 1, 1});      // comparisons compare in i64
  // A NaN bound of clamp is no bound (it had clamped nothing, silently).
  CHECK_THROWS_WITH(clamp(ones({2}), NAN, std::nullopt), Catch::Contains("clamp: a bound is nan (min nan, max none)"));
}
