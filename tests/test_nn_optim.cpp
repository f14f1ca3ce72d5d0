// Tests for optimizers, learning-rate schedules and gradient clipping. The expected
// parameters were produced by PyTorch 1.13 (Debian 12's python3-torch) running the same
// four steps on the same f32 inputs; weft must agree to the last bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "core/safetensors.h"
#include "weft.h"

using namespace weft;
using namespace weft::nn;

namespace {
// Four steps on p0 with gradients g_k = base * (k + 1) + 0.5 * p, all in f32.
template <class MakeOpt>
std::vector<double> run_steps(MakeOpt make_opt) {
  Tensor p = from_vector({0.5, -1.25, 2.0, 0.0, 3.5}, {5}).set_requires_grad();
  auto opt = make_opt(std::vector<Tensor>{p});
  Tensor base = from_vector({0.1, -0.2, 0.3, 0.05, -0.4}, {5});
  for (int k = 0; k < 4; ++k) {
    p.set_grad(base * double(k + 1) + p.detach() * 0.5);
    opt->step();
  }
  return to_vector(p);
}
void check_bits(const std::vector<double>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": weft " << std::hexfloat << float(got[i]) << " torch " << want[i]);
    CHECK(float(got[i]) == want[i]);
  }
}
}  // namespace

TEST_CASE("AdamW matches PyTorch bit for bit") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  });
  check_bits(got, {0x1.d50bdp-2f, -0x1.347c12p+0f, 0x1.f3b724p+0f, -0x1.3ee6d6p-5f, 0x1.b9818p+1f});
}

TEST_CASE("Adam with L2 weight decay matches PyTorch bit for bit") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  });
  check_bits(got, {0x1.d6fd2p-2f, -0x1.35bd6ap+0f, 0x1.f5bcfcp+0f, -0x1.3fa456p-5f, 0x1.bb1f8p+1f});
}

TEST_CASE("SGD with momentum, dampening, weight decay and nesterov matches PyTorch") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  });
  check_bits(got, {0x1.1803ccp-3f, -0x1.b103f6p-2f, 0x1.6b0304p-1f, -0x1.4bfcep-4f, 0x1.5ebf84p+1f});
  auto nest = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  });
  check_bits(nest, {-0x1.4e03ccp-8f, -0x1.bbc77ep-4f, 0x1.c6377ep-3f, -0x1.eff7fep-4f, 0x1.506974p+1f});
}

TEST_CASE("hand-computed steps: plain SGD and the first Adam step") {
  Tensor p = from_vector({1.0, -2.0}, {2}, {.dtype = kFloat64}).set_requires_grad();
  SGD sgd({p}, {.lr = 0.5});
  p.set_grad(from_vector({0.2, -0.4}, {2}, {.dtype = kFloat64}));
  sgd.step();
  CHECK(to_vector(p) == std::vector<double>{0.9, -1.8});
  // Adam's first step moves each parameter by lr * g / (|g| + eps) ~= lr * sign(g).
  Tensor q = from_vector({1.0, -2.0}, {2}, {.dtype = kFloat64}).set_requires_grad();
  Adam adam({q}, {.lr = 0.1, .eps = 0});
  q.set_grad(from_vector({3.0, -0.5}, {2}, {.dtype = kFloat64}));
  adam.step();
  auto v = to_vector(q);
  CHECK(v[0] == Approx(0.9).epsilon(1e-12));
  CHECK(v[1] == Approx(-1.9).epsilon(1e-12));
}

TEST_CASE("parameter groups carry their own options; parameters without grads are skipped") {
  Tensor a = ones({2}).set_requires_grad(), b = ones({2}).set_requires_grad(), c = ones({1}).set_requires_grad();
  SGD opt(std::vector<ParamGroup>{{{a}, {}}, {{b, c}, {{"lr", 0.0}}}}, {.lr = 1.0});
  a.set_grad(ones({2}));
  b.set_grad(ones({2}));
  opt.step();
  CHECK(to_vector(a) == std::vector<double>{0, 0});
  CHECK(to_vector(b) == std::vector<double>{1, 1});
  CHECK(to_vector(c) == std::vector<double>{1});
  CHECK(opt.lr(1) == 0.0);
  CHECK_THROWS_WITH(SGD(std::vector<ParamGroup>{{{a}, {{"betas", 1.0}}}}, {}), Catch::Contains("unknown option"));
  CHECK_THROWS_WITH(SGD(std::vector<Tensor>{a, a}, {}), Catch::Contains("more than one place"));
  opt.zero_grad();
  CHECK(!a.grad().defined());
}

TEST_CASE("optimizer state round-trips through safetensors bit-exactly") {
  auto dir = std::filesystem::temp_directory_path() / ("weft_optim_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "opt.safetensors").string();
  manual_seed(4);
  Linear lin(3, 2);
  AdamW opt(lin.parameters(), {.lr = 0.01});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    sum(square(lin(randn({4, 3})))).backward();
    opt.step();
  }
  NamedTensors all;
  for (auto& [k, t] : lin.state_dict()) all.emplace_back("model." + k, t);
  for (auto& [k, t] : opt.state_dict()) all.emplace_back("optim." + k, t);
  save_safetensors(path, all);

  manual_seed(5);
  Linear lin2(3, 2);
  AdamW opt2(lin2.parameters(), {.lr = 0.5});
  NamedTensorList msd, osd;
  for (auto& [k, t] : load_safetensors(path).tensors)
    (k.rfind("model.", 0) == 0 ? msd : osd).emplace_back(k.substr(6), t);
  lin2.load_state_dict(msd);
  opt2.load_state_dict(osd);
  CHECK(opt2.lr() == 0.01);
  // One more identical step on both: parameters stay bitwise equal.
  Tensor x = randn({4, 3});
  opt.zero_grad();
  sum(square(lin(x))).backward();
  opt.step();
  opt2.zero_grad();
  sum(square(lin2(x))).backward();
  opt2.step();
  CHECK(to_vector(lin.weight) == to_vector(lin2.weight));
  CHECK(to_vector(lin.bias) == to_vector(lin2.bias));
  auto bad = opt.state_dict();
  bad.pop_back();
  bad.emplace_back("state.0.exp_avg", ones({7}));
  CHECK_THROWS_WITH(opt2.load_state_dict(bad), Catch::Contains("shape"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("learning-rate schedules") {
  Tensor p = ones({1}).set_requires_grad();
  SGD opt({p}, {.lr = 1.0});
  LinearLR warm(opt, 0.25, 1.0, 3);
  std::vector<double> lrs;
  for (int i = 0; i < 5; ++i) {
    lrs.push_back(opt.lr());
    warm.step();
  }
  CHECK(lrs == std::vector<double>{0.25, 0.5, 0.75, 1.0, 1.0});
  SGD opt2({p}, {.lr = 2.0});
  CosineAnnealingLR cos(opt2, 4, 0.0);
  std::vector<double> c;
  for (int i = 0; i <= 4; ++i) {
    c.push_back(opt2.lr());
    cos.step();
  }
  CHECK(c[0] == Approx(2.0));
  CHECK(c[1] == Approx(1 + std::cos(M_PI / 4)));
  CHECK(c[2] == Approx(1.0));
  CHECK(c[4] == Approx(0.0).margin(1e-12));
  SGD opt3({p}, {.lr = 1.0});
  StepLR st(opt3, 2, 0.5);
  for (int i = 0; i < 5; ++i) st.step();
  CHECK(opt3.lr() == 0.25);  // 1 * 0.5^(5/2)
  SGD opt4({p}, {.lr = 1.0});
  WarmupCosineLR wc(opt4, 2, 10, 0.1);
  CHECK(opt4.lr() == Approx(0.5));
  wc.set_last_step(2);
  CHECK(opt4.lr() == Approx(1.0));
  wc.set_last_step(10);
  CHECK(opt4.lr() == Approx(0.1));
}

TEST_CASE("clip_grad_norm_ returns the total norm and scales gradients") {
  Tensor a = ones({2}).set_requires_grad(), b = ones({1}).set_requires_grad();
  a.set_grad(from_vector({3, 0}, {2}));
  b.set_grad(from_vector({4}, {1}));
  double n = clip_grad_norm_({a, b}, 1.0);
  CHECK(n == Approx(5.0));
  auto ga = to_vector(a.grad());
  CHECK(ga[0] == Approx(3.0 / (5 + 1e-6)));
  CHECK(to_vector(b.grad())[0] == Approx(4.0 / (5 + 1e-6)));
  // Below the limit nothing changes.
  double n2 = clip_grad_norm_({a, b}, 10.0);
  CHECK(n2 == Approx(1.0).epsilon(1e-5));
  CHECK(to_vector(b.grad())[0] == Approx(4.0 / (5 + 1e-6)));
  a.set_grad(from_vector({-7, 2}, {2}));
  CHECK(clip_grad_norm_({a, b}, 100.0, INFINITY) == Approx(7.0));
}
