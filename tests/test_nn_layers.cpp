// Tests for nn layers: forward values against hand computation, default initialisation
// ranges, and gradcheck through each layer's parameters and inputs (in f64).
#include <catch2/catch.hpp>
#include <array>
#include <cmath>

#include "weft.h"

using namespace weft;
using namespace weft::nn;
using autograd::gradcheck;
using autograd::TensorList;

namespace {
// gradcheck over a module's input and all of its parameters.
void check_module_grads(Module& m, const Tensor& input) {
  m.to(kFloat64);
  auto params = m.parameters();
  TensorList leaves{input};
  leaves.insert(leaves.end(), params.begin(), params.end());
  auto r = gradcheck([&](const TensorList&) { return m(leaves[0]); }, leaves);
  INFO(m.type_name() << ": " << r.message);
  CHECK(r.ok);
}
Tensor f64_input(const Shape& s, uint64_t seed = 5) {
  Generator g(seed);
  return randn(s, {.dtype = kFloat64}, &g).set_requires_grad();
}
}  // namespace

TEST_CASE("Linear computes x W^T + b and initialises in +-1/sqrt(in)") {
  Linear lin(3, 2);
  double bound = 1 / std::sqrt(3.0);
  for (double v : to_vector(lin.weight)) CHECK(std::abs(v) <= bound);
  for (double v : to_vector(lin.bias)) CHECK(std::abs(v) <= bound);
  {
    NoGradGuard g;
    lin.weight.copy_(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}));
    lin.bias.copy_(from_vector({0.5, -1}, {2}));
  }
  Tensor y = lin(from_vector({1, 0, -1, 2, 1, 0}, {2, 3}));
  CHECK(to_vector(y) == std::vector<double>{1 - 3 + 0.5, 4 - 6 - 1, 2 + 2 + 0.5, 8 + 5 - 1});
  check_module_grads(lin, f64_input({2, 3}));
  Linear nobias(3, 2, false);
  CHECK(!nobias.bias.defined());
  CHECK(nobias.parameters().size() == 1);
}

TEST_CASE("seeded initialisation is reproducible") {
  manual_seed(123);
  Linear a(16, 8);
  manual_seed(123);
  Linear b(16, 8);
  CHECK(to_vector(a.weight) == to_vector(b.weight));
  Generator g1(9), g2(9);
  Linear c(4, 4, true, &g1), d(4, 4, true, &g2);
  CHECK(to_vector(c.bias) == to_vector(d.bias));
}

TEST_CASE("Embedding looks up rows; LayerNorm and RMSNorm normalise the last dim") {
  Embedding emb(5, 3);
  Tensor idx = from_vector({4, 0, 4}, {3}, {.dtype = kInt64});
  Tensor e = emb(idx);
  auto w = to_vector(emb.weight), v = to_vector(e);
  for (int j = 0; j < 3; ++j) {
    CHECK(v[size_t(j)] == w[size_t(12 + j)]);
    CHECK(v[size_t(3 + j)] == w[size_t(j)]);
  }
  LayerNorm ln(4);
  Tensor y = ln(from_vector({1, 2, 3, 4}, {1, 4}));
  double m = 2.5, var = 1.25, r = 1 / std::sqrt(var + 1e-5);
  auto yv = to_vector(y);
  for (int i = 0; i < 4; ++i) CHECK(yv[size_t(i)] == Approx((i + 1 - m) * r).epsilon(1e-6));
  RMSNorm rms(2, 0.0);
  auto rv = to_vector(rms(from_vector({3, 4}, {1, 2})));
  double rmsv = std::sqrt((9 + 16) / 2.0);
  CHECK(rv[0] == Approx(3 / rmsv));
  CHECK(rv[1] == Approx(4 / rmsv));
  Embedding emb2(5, 3);
  emb2.to(kFloat64);
  auto r2 = gradcheck([&](const TensorList&) { return emb2(idx); }, {emb2.weight});
  CHECK(r2.ok);
  check_module_grads(ln, f64_input({3, 4}));
  check_module_grads(rms, f64_input({3, 2}));
}

TEST_CASE("Dropout drops in training and is the identity in eval") {
  manual_seed(0);
  Dropout d(0.5);
  Tensor x = ones({1000});
  auto v = to_vector(d(x));
  int zeros_count = 0;
  for (double a : v) {
    CHECK((a == 0 || a == 2));
    zeros_count += a == 0;
  }
  CHECK(zeros_count > 400);
  CHECK(zeros_count < 600);
  d.eval();
  CHECK(to_vector(d(x)) == to_vector(x));
}

TEST_CASE("ReLU, GELU, Flatten, Sequential") {
  CHECK(to_vector(ReLU()(from_vector({-1, 2}, {2}))) == std::vector<double>{0, 2});
  double g1 = 0.5 * (1 + std::erf(1 / std::sqrt(2.0)));
  CHECK(GELU()(from_vector({1}, {1})).item() == Approx(g1));
  double t1 = 0.5 * (1 + std::tanh(std::sqrt(2 / M_PI) * (1 + 0.044715)));
  CHECK(GELU("tanh")(from_vector({1}, {1})).item() == Approx(t1));
  CHECK(Flatten()(ones({2, 3, 4})).shape() == Shape{2, 12});
  Sequential seq{std::make_shared<Linear>(4, 8), std::make_shared<GELU>(), std::make_shared<Linear>(8, 2)};
  CHECK(seq(ones({5, 4})).shape() == Shape{5, 2});
  check_module_grads(seq, f64_input({3, 4}));
}

TEST_CASE("Conv2d and MaxPool2d") {
  Conv2d conv(1, 1, 2, 1, 0, true);
  {
    NoGradGuard g;
    conv.weight.copy_(from_vector({1, 0, 0, 1}, {1, 1, 2, 2}));
    conv.bias.fill_(1);
  }
  Tensor x = from_vector({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  CHECK(to_vector(conv(x)) == std::vector<double>{1 + 5 + 1, 2 + 6 + 1, 4 + 8 + 1, 5 + 9 + 1});
  CHECK(to_vector(MaxPool2d(2)(from_vector({1, 5, 2, 0, 3, 4, 7, 1, 0, 9, 2, 2, 8, 1, 3, 6}, {1, 1, 4, 4}))) ==
        std::vector<double>{5, 7, 9, 6});
  Conv2d conv2(2, 3, 3, 1, 1);
  check_module_grads(conv2, f64_input({1, 2, 4, 4}));
}

TEST_CASE("transformer Block keeps shapes, is causal and differentiable") {
  TransformerConfig cfg{.d_model = 8, .n_head = 2};
  manual_seed(3);
  Block block(cfg);
  auto names = block.named_parameters();
  CHECK(names[0].first == "ln_1.weight");
  CHECK(names[2].first == "attn.c_attn.weight");
  CHECK(block.attn->c_attn->weight.shape() == Shape{24, 8});
  Tensor x = randn({2, 5, 8});
  Tensor y = block(x);
  CHECK(y.shape() == Shape{2, 5, 8});
  // Causality: changing the last position does not change earlier outputs.
  Tensor x2 = x.clone();
  {
    NoGradGuard g;
    x2.select(1, 4).fill_(3.0);
  }
  Tensor y2 = block(x2);
  auto a = to_vector(y.narrow(1, 0, 4)), b = to_vector(y2.narrow(1, 0, 4));
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-6));
  CHECK(to_vector(y.select(1, 4)) != to_vector(y2.select(1, 4)));
  Block small(TransformerConfig{.d_model = 4, .n_head = 2});
  check_module_grads(small, f64_input({1, 3, 4}));
}

TEST_CASE("losses: mse_loss and cross_entropy") {
  Tensor a = from_vector({1, 2, 3}, {3}), b = from_vector({1, 0, 0}, {3});
  CHECK(mse_loss(a, b).item() == Approx((0 + 4 + 9) / 3.0));
  CHECK(mse_loss(a, b, "sum").item() == Approx(13));
  CHECK(to_vector(mse_loss(a, b, "none")) == std::vector<double>{0, 4, 9});
  CHECK_THROWS_AS(mse_loss(a, ones({2})), Error);
  // Integer tensors are refused whatever the reduction, as torch's mse_loss (its mean has no integer form).
  Tensor ai = a.to(kInt64), bi = b.to(kInt64);
  for (const char* r : {"mean", "sum", "none"})
    CHECK_THROWS_WITH(mse_loss(ai, bi, r), Catch::Contains("mse_loss") && Catch::Contains("i64[3]"));
  Tensor logits = from_vector({0, 0, 0, 1, 2, 3}, {2, 3});
  Tensor target = from_vector({0, 2}, {2}, {.dtype = kInt64});
  double l0 = std::log(3.0), l1 = std::log(std::exp(1) + std::exp(2) + std::exp(3)) - 3;
  CHECK(nn::cross_entropy(logits, target).item() == Approx((l0 + l1) / 2));
}

TEST_CASE("nn::init: fans, gains and the ranges of each initialiser") {
  Tensor w = empty({64, 32, 3, 3});
  auto [fi, fo] = init::fan_in_and_fan_out(w);
  CHECK(fi == 32 * 9);
  CHECK(fo == 64 * 9);
  CHECK(init::calculate_gain("relu") == Approx(std::sqrt(2.0)));
  CHECK(init::calculate_gain("leaky_relu", std::sqrt(5.0)) == Approx(std::sqrt(1.0 / 3)));
  CHECK_THROWS_WITH(init::calculate_gain("swish"), Catch::Contains("swish"));
  auto stats = [](const Tensor& t) {
    auto v = to_vector(t);
    double mn = 1e9, mx = -1e9, s = 0, sq = 0;
    for (double a : v) { mn = std::min(mn, a); mx = std::max(mx, a); s += a; sq += a * a; }
    double m = s / double(v.size());
    return std::array<double, 3>{mn, mx, std::sqrt(sq / double(v.size()) - m * m)};
  };
  Generator g(1);
  Tensor a = empty({256, 128});
  init::xavier_uniform_(a, 1.0, &g);
  double xb = std::sqrt(6.0 / (256 + 128));
  auto sa = stats(a);
  CHECK(sa[0] >= -xb);
  CHECK(sa[1] <= xb);
  CHECK(sa[1] > 0.95 * xb);
  init::xavier_normal_(a, 1.0, &g);
  CHECK(stats(a)[2] == Approx(std::sqrt(2.0 / (256 + 128))).epsilon(0.03));
  init::kaiming_normal_(a, 0, "fan_in", "relu", &g);
  CHECK(stats(a)[2] == Approx(std::sqrt(2.0 / 128)).epsilon(0.03));
  init::kaiming_uniform_(a, 0, "fan_out", "relu", &g);
  double kb = std::sqrt(3.0) * std::sqrt(2.0 / 256);
  CHECK(stats(a)[1] <= kb);
  CHECK(stats(a)[1] > 0.95 * kb);
  init::normal_(a, 2.0, 0.5, &g);
  CHECK(stats(a)[2] == Approx(0.5).epsilon(0.03));
  init::uniform_(a, -3, -2, &g);
  CHECK(stats(a)[0] >= -3);
  CHECK(stats(a)[1] < -2);
  init::zeros_(a);
  CHECK(stats(a)[1] == 0);
  init::ones_(a);
  CHECK(stats(a)[0] == 1);
  init::constant_(a, 0.25);
  CHECK(stats(a)[2] == Approx(0).margin(1e-12));
  Tensor leaf = ones({3}).set_requires_grad();
  init::normal_(leaf);  // initialisers work on parameters (they run without recording)
  CHECK(leaf.requires_grad());
  CHECK_THROWS_WITH(init::kaiming_uniform_(leaf), Catch::Contains("at least 2 dims"));
}

TEST_CASE("layer constructors name the layer and the argument at fault") {
  using Catch::Contains;
  CHECK_THROWS_WITH(Linear(-1, 4), Contains("Linear: in_features must be >= 1, got -1"));
  CHECK_THROWS_WITH(Linear(4, -2), Contains("Linear: out_features must be >= 0, got -2"));
  CHECK_THROWS_WITH(Embedding(-5, 3), Contains("Embedding: num_embeddings must be >= 0, got -5"));
  CHECK_THROWS_WITH(Embedding(5, -3), Contains("Embedding: embedding_dim"));
  CHECK_THROWS_WITH(LayerNorm(0), Contains("LayerNorm: dim must be >= 1, got 0"));
  CHECK_THROWS_WITH(LayerNorm(4, -1e-5), Contains("LayerNorm: eps"));
  CHECK_THROWS_WITH(RMSNorm(-1), Contains("RMSNorm: dim"));
  CHECK_THROWS_WITH(Conv2d(0, 4, 3), Contains("Conv2d: in_channels must be >= 1, got 0"));
  CHECK_THROWS_WITH(Conv2d(1, 4, 0), Contains("Conv2d: kernel_size must be >= 1, got 0"));
  CHECK_THROWS_WITH(Conv2d(1, 4, 3, 0), Contains("Conv2d: stride must be >= 1, got 0"));
  CHECK_THROWS_WITH(Conv2d(1, 4, 3, 1, -1), Contains("Conv2d: padding must be >= 0, got -1"));
  CHECK_THROWS_WITH(MaxPool2d(0), Contains("MaxPool2d: kernel_size"));
  CHECK_THROWS_WITH(MaxPool2d(2, 0), Contains("MaxPool2d: stride"));
  CHECK_THROWS_WITH(MaxPool2d(2, 2, 3), Contains("MaxPool2d: padding 3 must be at most half of kernel_size 2"));
  CHECK_THROWS_WITH(Dropout(1.0), Contains("Dropout: p must be in [0, 1)"));
  CHECK_THROWS_WITH(Dropout(-0.5), Contains("Dropout: p must be in [0, 1)"));
  CHECK_NOTHROW(Dropout(0.0));
  CHECK_NOTHROW(MaxPool2d(2));  // stride defaults to the kernel size
  CHECK_THROWS_WITH(Linear(0, 3), Contains("Linear: in_features must be >= 1, got 0"));  // no fan-in to scale by
  CHECK_NOTHROW(Linear(3, 0));

  TransformerConfig ok{.d_model = 8, .n_head = 2};
  CHECK_NOTHROW(Block(ok));
  auto with = [&](auto f) { TransformerConfig c = ok; f(c); return c; };
  CHECK_THROWS_WITH(CausalSelfAttention(with([](auto& c) { c.n_head = 0; })),
                    Contains("CausalSelfAttention: n_head must be >= 1, got 0"));
  CHECK_THROWS_WITH(CausalSelfAttention(with([](auto& c) { c.n_head = 3; })),
                    Contains("d_model 8 must be divisible by n_head 3"));
  CHECK_THROWS_WITH(MLP(with([](auto& c) { c.d_model = -8; })), Contains("MLP: d_model must be >= 1, got -8"));
  CHECK_THROWS_WITH(MLP(with([](auto& c) { c.gelu_approximate = "erf"; })), Contains("MLP: gelu_approximate"));
  CHECK_THROWS_WITH(Block(with([](auto& c) { c.dropout = 1.0; })), Contains("Block: dropout must be in [0, 1), got 1"));
}

// An empty batch's norm gradients are zeros, as Linear's and Embedding's: the kernels write no row, and the weight and
// bias gradients had kept whatever their memory held before (memory freed just before is the likeliest).
TEST_CASE("layer_norm and rms_norm of an empty batch give zero weight and bias gradients") {
  for (bool rms : {true, false})
    for (int i = 0; i < 8; ++i) {
      INFO((rms ? "rms_norm" : "layer_norm") << ", round " << i);
      { Tensor junk = full({4}, 42.0 + i), more = full({2, 4}, 1e30); }
      Tensor w = ones({4}), b = zeros({4}), x = zeros({0, 4});
      for (Tensor* t : {&w, &b, &x}) t->set_requires_grad(true);
      sum(rms ? rms_norm(x, {4}, w) : layer_norm(x, {4}, w, b)).backward();
      CHECK(to_vector(w.grad()) == std::vector<double>(4, 0.0));
      if (!rms) CHECK(to_vector(b.grad()) == std::vector<double>(4, 0.0));
    }
}
