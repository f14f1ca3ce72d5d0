// Tests for the autograd engine: accumulation, dependency order, hooks and their order,
// queue_callback, custom Functions, retain_graph, NoGradGuard and detach.
#include <catch2/catch.hpp>

#include "weft.h"

using namespace weft;
using autograd::Engine;
using autograd::TensorList;

static std::vector<double> vec(const Tensor& t) { return to_vector(t); }

TEST_CASE("gradients accumulate into leaves across uses and backward calls") {
  Tensor x = from_vector({1, 2, 3}, {3}).set_requires_grad();
  Tensor y = sum(x * x + x * 3.0);  // dy/dx = 2x + 3
  y.backward();
  CHECK(vec(x.grad()) == std::vector<double>{5, 7, 9});
  sum(x * 2.0).backward();  // accumulates
  CHECK(vec(x.grad()) == std::vector<double>{7, 9, 11});
  CHECK(y.item() == Approx(1 + 4 + 9 + 3 * 6));
}

TEST_CASE("a diamond graph runs each node once with summed gradients") {
  Tensor x = from_vector({2}, {1}).set_requires_grad();
  Tensor a = exp(x);
  Tensor b = a * a + a;  // d/dx = (2a + 1) * a
  b.backward(ones({1}));
  double e2 = std::exp(2.0);
  CHECK(x.grad().item() == Approx((2 * e2 + 1) * e2));
}

TEST_CASE("gradients are summed in place only where no other node holds the same tensor") {
  // t = u + v hands one gradient tensor to both u's and v's nodes; a later gradient for u must
  // not be added into that shared tensor, or v's gradient changes too. Both creation orders:
  // the shared tensor arrives at u first, or second.
  for (bool shared_first : {true, false}) {
    INFO((shared_first ? "u * 3 recorded before u + v" : "u + v recorded before u * 3"));
    Tensor x = from_vector({0.5, 1}, {2}).set_requires_grad(), y = from_vector({2, -1}, {2}).set_requires_grad();
    Tensor u = exp(x), v = exp(y), w, t;
    if (shared_first) w = u * 3.0, t = u + v;
    else t = u + v, w = u * 3.0;
    (sum(t * 2.0) + sum(w)).backward();  // t's gradient a contiguous tensor of its own, 2
    for (int i = 0; i < 2; ++i) {
      CHECK(vec(x.grad())[i] == Approx(5 * vec(u)[i]));
      CHECK(vec(y.grad())[i] == Approx(2 * vec(v)[i]));
    }
  }
}

TEST_CASE("backward needs a gradient for non-scalar roots") {
  Tensor x = ones({2, 2}).set_requires_grad();
  Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("scalar"));
  y.backward(full({2, 2}, 0.5));
  CHECK(vec(x.grad()) == std::vector<double>{1, 1, 1, 1});
}

TEST_CASE("backward twice through a freed graph is an error unless retained") {
  Tensor x = ones({3}).set_requires_grad();
  Tensor y = sum(exp(x));
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  CHECK(vec(x.grad())[0] == Approx(2 * std::exp(1.0)));
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("second time"));
}

TEST_CASE("no in-place write reaches a tensor that requires grad while grad mode is on") {
  // Autograd does not record in-place writes: y.fill_(5) before backward had given x.grad 20 (the
  // product's gradient taken at the filled values, then through y = 2x) where 0 is right.
  Tensor x = ones({4}).set_requires_grad();
  Tensor y = x * 2.0;
  const auto refused = Catch::Contains("requires grad and cannot be written in place while grad mode is on");
  CHECK_THROWS_WITH(y.fill_(5), refused);
  CHECK_THROWS_WITH(y.copy_(zeros({4})), refused);
  CHECK_THROWS_WITH(x.fill_(3), refused);  // a leaf
  CHECK_THROWS_WITH(x.narrow(0, 0, 2).fill_(3), refused);  // views of a leaf: they write its values
  CHECK_THROWS_WITH(x.view({2, 2}).zero_(), refused);
  CHECK_THROWS_WITH(x.narrow(0, 1, 2).copy_(ones({2})), refused);
  CHECK_THROWS_WITH(y.normal_(), refused);
  CHECK(vec(x) == std::vector<double>{1, 1, 1, 1});
  sum(y * y).backward();
  CHECK(vec(x.grad()) == std::vector<double>{8, 8, 8, 8});
  NoGradGuard no_grad;  // outside autograd's view: allowed
  x.narrow(0, 0, 2).fill_(3);
  CHECK(vec(x) == std::vector<double>{3, 3, 1, 1});
}

TEST_CASE("backward refuses to read an input written in place after the forward used it") {
  const auto written = Catch::Contains("was written in place after the forward used it");
  Tensor x = ones({3}).set_requires_grad();
  Tensor w = full({3}, 2.0);
  Tensor z = sum(x * w);
  w.fill_(5);  // x's gradient had been 5 (the new w) instead of 2
  CHECK_THROWS_WITH(z.backward(), Catch::Contains("backward: input 1 of MulBackward") && written);
  Tensor v = full({4}, 2.0);  // a write through another view of the same storage counts
  Tensor z2 = sum(x * v.narrow(0, 0, 3));
  v.narrow(0, 3, 1).copy_(full({1}, 9.0));
  CHECK_THROWS_WITH(z2.backward(), written);
  Tensor p = ones({2}).set_requires_grad();  // an optimizer step between forward and backward
  nn::SGD opt({p}, {.lr = 0.5});
  Tensor y = sum(p * p);
  p.set_grad(ones({2}));
  opt.step();
  CHECK_THROWS_WITH(y.backward(), written);
  w.fill_(2);  // written before the forward: nothing to refuse
  Tensor z3 = sum(x * w);
  z3.backward();
  CHECK(vec(x.grad()) == std::vector<double>{2, 2, 2});
  Tensor z4 = sum(x * w);  // a refused write writes nothing, so it leaves the forward's input valid
  CHECK_THROWS_WITH(w.uniform_(0, INFINITY), Catch::Contains("uniform_: needs finite low <= high, got [0, inf]"));
  CHECK_THROWS_WITH(w.normal_(NAN, 1), Catch::Contains("normal_: needs a finite mean"));
  CHECK_NOTHROW(z4.backward());
}

TEST_CASE("a view made under NoGradGuard of a tensor that requires grad is not written with grad mode on") {
  const auto refused = Catch::Contains("is a view made with grad mode off (under NoGradGuard) of a tensor that requires grad");
  Tensor a = ones({3}).set_requires_grad();
  Tensor b = a * 2.0, v, w;
  {
    NoGradGuard no_grad;
    v = b.narrow(0, 0, 1);
  }
  CHECK(!v.requires_grad());
  CHECK_THROWS_WITH(v.fill_(10), Catch::Contains("fill_: ") && refused);  // b[0] = 10 had kept a's gradient 4
  CHECK_THROWS_WITH(v.copy_(full({1}, 10.0)), Catch::Contains("copy_: ") && refused);
  w = v.view({1});  // a view of such a view too
  CHECK_THROWS_WITH(w.zero_(), refused);
  {
    NoGradGuard no_grad;  // with grad mode off, as where it was made: allowed
    v.fill_(10);
  }
  Tensor d = b.detach();  // a detached alias is the caller's to write
  CHECK_NOTHROW(d.narrow(0, 1, 1).fill_(3));
}

TEST_CASE("backward refuses to read an output written in place after the forward made it") {
  const auto written = Catch::Contains("was written in place after the forward made it");
  // Each op whose backward reads its own output, the output then written outside autograd's view (no_grad, or a
  // detached alias): the gradient had been computed from the written values (exp's from 0.25 instead of e^x).
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops = {
      {"ExpBackward", [](const Tensor& x) { return exp(x); }},
      {"SigmoidBackward", [](const Tensor& x) { return sigmoid(x); }},
      {"ReluBackward", [](const Tensor& x) { return relu(x); }},
      {"SqrtBackward", [](const Tensor& x) { return sqrt(x); }},
      {"SoftmaxBackward", [](const Tensor& x) { return softmax(x, 0); }},
      {"LogSoftmaxBackward", [](const Tensor& x) { return log_softmax(x, 0); }},
      {"DivBackward", [](const Tensor& x) { return from_vector({1, 2, 3}, {3}) / x; }},
      {"ScaledDotProductAttentionBackward",
       [](const Tensor& x) { return scaled_dot_product_attention(x.view({1, 1, 3, 1}), x.view({1, 1, 3, 1}),
                                                                 x.view({1, 1, 3, 1}), true); }}};
  for (const auto& [name, op] : ops) {
    INFO(name);
    Tensor x = from_vector({0.5, 1.0, 0.3}, {3}).set_requires_grad();
    Tensor y = op(x);
    {
      NoGradGuard no_grad;
      y.fill_(0.25);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains(std::string("the output of ") + name) && written);
    Tensor y2 = op(x);
    y2.detach().fill_(0.25);
    CHECK_THROWS_WITH(sum(y2).backward(), written);
  }
  Tensor x = from_vector({0.5, 1.0, 0.3}, {3}).set_requires_grad();  // an op that reads only its input: allowed
  Tensor y = x * 2.0;
  y.detach().fill_(0.25);
  sum(y).backward();
  CHECK(vec(x.grad()) == std::vector<double>{2, 2, 2});
}

TEST_CASE("tensor hooks fire in backward order and may replace gradients") {
  Tensor x = from_vector({1, 2}, {2}).set_requires_grad();
  std::vector<std::string> order;
  Tensor a = x * 3.0;
  Tensor b = a * 2.0;
  a.register_hook([&](const Tensor& g) { order.push_back("a"); return g * 10.0; });
  b.register_hook([&](const Tensor& g) { order.push_back("b"); return Tensor(); });
  x.register_hook([&](const Tensor& g) { order.push_back("x"); return Tensor(); });
  x.register_post_accumulate_grad_hook([&](Tensor& p) {
    order.push_back("post");
    CHECK(p.grad().defined());
  });
  sum(b).backward();
  CHECK(order == std::vector<std::string>{"b", "a", "x", "post"});
  CHECK(vec(x.grad()) == std::vector<double>{60, 60});  // 2 * 10 * 3
  // A leaf's hook must return a gradient like the one it got (ones({5}) had become x's gradient).
  Tensor y = ones({2, 2}).set_requires_grad();
  y.register_hook([](const Tensor&) { return ones({5}); });
  CHECK_THROWS_WITH(sum(y * 2.0).backward(), Catch::Contains("backward: a hook of f32[2, 2]") &&
                                                 Catch::Contains("returned f32[5] on cpu for its gradient f32[2, 2]"));
  Tensor z = ones({2}).set_requires_grad();
  CHECK_THROWS_WITH(z.set_grad(ones({2}, {.dtype = kInt64})), Catch::Contains("set_grad: gradient i64[2]"));
  // So must a non-leaf's: its [3, 2] had been read as the [2, 3] gradient, row after row.
  Tensor w = ones({2, 3}).set_requires_grad(), h = w * 2.0;
  h.register_hook([](const Tensor&) { return from_vector({1, 2, 3, 4, 5, 6}, {3, 2}); });
  CHECK_THROWS_WITH(sum(h).backward(), Catch::Contains("backward: a hook on output 0 of MulBackward") &&
                                           Catch::Contains("returned f32[3, 2] on cpu for its gradient f32[2, 3]"));
}

TEST_CASE("a gradient set as an expanded view takes the next backward's sum out of place, as PyTorch") {
  Tensor x = zeros({2}).set_requires_grad();
  x.set_grad(ones({1}).expand({2}));  // add_ into it had failed naming neither x nor its gradient
  sum(x * from_vector({2, 3}, {2})).backward();
  CHECK(vec(x.grad()) == std::vector<double>{3, 4});
}

TEST_CASE("retain_grad keeps a non-leaf gradient") {
  Tensor x = ones({2}).set_requires_grad();
  Tensor h = x * 4.0;
  h.retain_grad();
  sum(h * h).backward();
  CHECK(vec(h.grad()) == std::vector<double>{8, 8});
  // A second backward adds to it, as to the leaf's.
  Tensor b = zeros({2}).set_requires_grad(), k = b + 0.0;
  k.retain_grad();
  sum(k * from_vector({1, 2}, {2})).backward({}, true);
  sum(k * from_vector({10, 20}, {2})).backward();
  CHECK(vec(k.grad()) == std::vector<double>{11, 22});
  CHECK(vec(b.grad()) == std::vector<double>{11, 22});
}

TEST_CASE("queue_callback runs once after all nodes, and only during backward") {
  CHECK_THROWS_WITH(Engine::queue_callback([] {}), Catch::Contains("no backward"));
  Tensor x = ones({2}).set_requires_grad();
  int calls = 0;
  bool saw_grad = false;
  Tensor y = x * 2.0;
  y.register_hook([&](const Tensor& g) {
    Engine::queue_callback([&] {
      ++calls;
      saw_grad = x.grad().defined();  // the leaf was accumulated before the callback
      Engine::queue_callback([&] { ++calls; });  // callbacks may queue callbacks
    });
    return Tensor();
  });
  sum(y).backward();
  CHECK(calls == 2);
  CHECK(saw_grad);
}

namespace {
// y = x * k, with a backward that also counts its calls.
struct ScaleFn : autograd::Function {
  double k;
  int* calls;
  ScaleFn(double k_, int* c) : k(k_), calls(c) {}
  std::string name() const override { return "ScaleFn"; }
  TensorList forward(autograd::FunctionCtx& ctx, const TensorList& in) override {
    CHECK(!GradMode::is_enabled());
    return {in[0] * k};
  }
  TensorList backward(autograd::FunctionCtx& ctx, const TensorList& g) override {
    ++*calls;
    return {g[0] * k};
  }
};
// Identity whose backward reports that the input gradient is ready (as FSDP's post-backward).
struct Identity : autograd::Function {
  bool* fired;
  explicit Identity(bool* f) : fired(f) {}
  TensorList forward(autograd::FunctionCtx&, const TensorList& in) override { return {in[0]}; }
  TensorList backward(autograd::FunctionCtx&, const TensorList& g) override {
    *fired = true;
    return {g[0]};
  }
};
}  // namespace

TEST_CASE("custom Functions record a node with their own backward") {
  int calls = 0;
  Tensor x = from_vector({1, -2}, {2}).set_requires_grad();
  Tensor y = autograd::Function::apply<ScaleFn>({x}, 3.0, &calls)[0];
  CHECK(y.grad_fn() != nullptr);
  CHECK(y.grad_fn()->name() == "ScaleFn");
  sum(y * y).backward();  // d/dx (3x)^2 = 18x
  CHECK(calls == 1);
  CHECK(vec(x.grad()) == std::vector<double>{18, -36});

  bool fired = false;
  Tensor z = autograd::Function::apply<Identity>({x}, &fired)[0];
  CHECK(z.storage() == x.storage());
  sum(z).backward();
  CHECK(fired);
}

TEST_CASE("NoGradGuard and detach stop recording") {
  Tensor x = ones({2}).set_requires_grad();
  {
    NoGradGuard guard;
    Tensor y = x * 2.0;
    CHECK(!y.requires_grad());
  }
  Tensor d = x.detach();
  CHECK(!d.requires_grad());
  CHECK(d.storage() == x.storage());
  CHECK((x * 2.0).requires_grad());
}

TEST_CASE("gradients flow through views back to the base") {
  Tensor x = arange(0, 6, 1, {.dtype = kFloat64}).view({2, 3}).detach().set_requires_grad();
  Tensor y = x.t().select(0, 1) * from_vector({10, 20}, {2}, {.dtype = kFloat64});  // column 1
  sum(y).backward();
  CHECK(vec(x.grad()) == std::vector<double>{0, 10, 0, 0, 20, 0});
  x.set_grad({});
  sum(x.unsqueeze(0).expand({4, 2, 3})).backward();
  CHECK(vec(x.grad()) == std::vector<double>(6, 4.0));
}

TEST_CASE("dtype conversions are differentiable and gradients keep the leaf dtype") {
  Tensor x = ones({2}, {.dtype = kFloat64}).set_requires_grad();
  Tensor y = x.to(kFloat32) * 2.0;
  sum(y).backward();
  CHECK(x.grad().dtype() == kFloat64);
  CHECK(vec(x.grad()) == std::vector<double>{2, 2});
}

// Products over an empty inner dimension are zeros (plus the bias), with empty gradients for the
// empty factors; an empty output gives the input zero gradients.
TEST_CASE("matmul and linear with zero-size dimensions, forward and backward") {
  Tensor a = zeros({2, 0}), b = zeros({0, 3});
  a.set_requires_grad(true), b.set_requires_grad(true);
  Tensor y = matmul(a, b);
  CHECK(y.shape() == Shape{2, 3});
  sum(y).backward();
  CHECK((a.grad().shape() == Shape{2, 0} && b.grad().shape() == Shape{0, 3}));
  Tensor x = zeros({2, 5, 0}), w = zeros({3, 0}), bias = from_vector({1, 2, 3}, {3});
  x.set_requires_grad(true), w.set_requires_grad(true), bias.set_requires_grad(true);
  Tensor z = linear(x, w, bias);
  CHECK(to_vector(z) == to_vector(bias.expand({2, 5, 3}).contiguous()));
  sum(z).backward();
  CHECK((x.grad().shape() == Shape{2, 5, 0} && w.grad().shape() == Shape{3, 0}));
  CHECK(to_vector(bias.grad()) == std::vector<double>{10, 10, 10});
  Tensor x2 = ones({2, 4}), none = zeros({0, 4});
  x2.set_requires_grad(true);
  Tensor out = linear(x2, none, Tensor());
  CHECK(out.shape() == Shape{2, 0});
  sum(out).backward();
  CHECK(to_vector(x2.grad()) == std::vector<double>(8, 0.0));
}

TEST_CASE("an integer or bool result leaves the graph: a cast to i64 passes no gradient back (as PyTorch)") {
  Tensor x = from_vector({1.5, 2.5, -0.7}, {3}).set_requires_grad();
  const Tensor r = x.to(kInt64);
  CHECK_FALSE(r.requires_grad());
  CHECK_FALSE(r.view({3, 1}).requires_grad());
  CHECK_FALSE(x.to(kBool).requires_grad());
  Tensor z = x * 1.0 + x.to(kInt64).to(kFloat32) * 5.7;
  sum(z).backward();
  CHECK(to_vector(x.grad()) == std::vector<double>{1, 1, 1});  // the truncated 5.7 (5) had been added through the cast
  CHECK(x.to(kFloat64).requires_grad());                      // a floating cast stays differentiable
}

// Returns the transposed incoming gradient, or a flat one: wrong shapes with the right number of elements.
struct WrongShapeFn : autograd::Function {
  bool flat;
  explicit WrongShapeFn(bool f) : flat(f) {}
  TensorList forward(autograd::FunctionCtx&, const TensorList& in) override { return {in[0].clone()}; }
  TensorList backward(autograd::FunctionCtx&, const TensorList& g) override {
    return {flat ? g[0].reshape({g[0].numel()}) : g[0].t().contiguous()};
  }
};

TEST_CASE("a backward returning a gradient of another shape is refused, not reshaped; size-1 dims may differ") {
  for (bool flat : {false, true}) {
    Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad();
    Tensor y = autograd::Function::apply<WrongShapeFn>({x}, flat)[0];
    CHECK_THROWS_WITH(sum(y * from_vector({1, 2, 3, 4, 5, 6}, {2, 3})).backward(),
                      Catch::Contains(flat ? "gradient of shape [6] for an input of shape [2, 3]"
                                           : "gradient of shape [3, 2] for an input of shape [2, 3]"));
  }
  Tensor x = from_vector({1, 2, 3}, {1, 3}).set_requires_grad();
  Tensor y = autograd::Function::apply<WrongShapeFn>({x}, true)[0];  // [3] for [1, 3]: the same values
  sum(y * from_vector({1, 2, 3}, {1, 3})).backward();
  CHECK(vec(x.grad()) == std::vector<double>{1, 2, 3});
}
