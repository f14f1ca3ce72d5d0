// Tests for optimizers, learning-rate schedules and gradient clipping. The expected parameters were produced by
// PyTorch running the same steps on the same f32 inputs (torch.optim defaults: the single-tensor path), printed by
// scripts/optim_reference.py; weft must agree to the last bit. The four-step cases are PyTorch 1.13's and 2.15's
// alike except Adam's element 20, where 2.15's f32 sqrt (MKL's) rounds the other way: the values are 1.13's.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <optional>
#include <unistd.h>

#include "core/safetensors.h"
#include "weft.h"

using namespace weft;
using namespace weft::nn;

namespace {
// `steps` steps on n parameters with gradients g_k = base * (k + 1) + 0.5 * p, all in f32.
// (32 elements and more: PyTorch runs its vectorized kernels, whose rounding is the one specified.)
template <class MakeOpt>
std::vector<double> run_steps(MakeOpt make_opt, int64_t n = 32, int steps = 4, int a = 37, int b = 13) {
  std::vector<double> p0, b0;
  for (int64_t i = 0; i < n; ++i) {
    p0.push_back(double((i * a) % 23 - 11) / 7.0);
    b0.push_back(double((i * b) % 17 - 8) / 20.0);
  }
  Tensor p = from_vector(p0, {n}).set_requires_grad();
  auto opt = make_opt(std::vector<Tensor>{p});
  Tensor base = from_vector(b0, {n});
  for (int k = 0; k < steps; ++k) {
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
  check_bits(got, {-0x1.867904p+0f, 0x1.8c99ccp-2f, -0x1.a10860p-1f, 0x1.1a7ea8p+0f, -0x1.a6cf44p-4f, -0x1.675c28p+0f,
       0x1.0eef06p-1f, -0x1.57c3eep-1f, 0x1.444d40p+0f, -0x1.3dd5ccp-5f, -0x1.3e8304p+0f, 0x1.585af6p-1f,
       -0x1.0f1718p-1f, 0x1.620e2ep+0f, 0x1.a620e0p-4f, -0x1.192f2ap+0f, 0x1.ae2782p-1f, -0x1.8ccdb0p-2f,
       0x1.867114p+0f, 0x1.f4e6b4p-3f, -0x1.e9794ap-1f, 0x1.00998ep+0f, -0x1.4a06bep-2f, -0x1.86a958p+0f,
       0x1.a7cf08p-2f, -0x1.a0bf74p-1f, 0x1.193662p+0f, -0x1.70b58cp-3f, -0x1.620182p+0f, 0x1.29dc04p-1f,
       -0x1.7e6578p-1f, 0x1.3d96f6p+0f});
}

// The first moment as PyTorch >= 2.0 keeps it, exp_avg.lerp_(grad, 1 - beta1) (one fused multiply-add of g - m),
// not 1.x's exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1): on these inputs the two round apart in 4 of the 64.
TEST_CASE("AdamW's first moment is PyTorch 2's lerp, bit for bit") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
  }, 64, 6, 43, 31);
  check_bits(got, {-0x1.808caap+0f, 0x1.37d4bap+0f, 0x1.9578b8p-1f, 0x1.7728c2p-2f, 0x1.dcc2cep-5f, -0x1.779c42p-2f,
      -0x1.c47a0ep-1f, -0x1.442accp+0f, 0x1.807628p+0f, 0x1.13e91ap+0f, 0x1.719ae2p-1f, 0x1.5d220ep-2f,
      -0x1.98df22p-3f, -0x1.2efb06p-1f, -0x1.df5c12p-1f, -0x1.5c1b92p+0f, 0x1.66a440p+0f, 0x1.05bc92p+0f,
      0x1.046896p-1f, 0x1.541558p-4f, -0x1.cbc166p-3f, -0x1.4cceb2p-1f, -0x1.137edep+0f, -0x1.915d88p+0f,
      0x1.37ce92p+0f, 0x1.9568f2p-1f, 0x1.89c952p-2f, 0x1.dc9cd6p-5f, -0x1.77b7ecp-2f, -0x1.c31002p-1f,
      -0x1.4042c0p+0f, 0x1.807cb8p+0f, 0x1.155de2p+0f, 0x1.77a6eap-1f, 0x1.5d543cp-2f, -0x1.98acc6p-3f,
      -0x1.2707e0p-1f, -0x1.de5642p-1f, -0x1.5c1ca8p+0f, 0x1.69d744p+0f, 0x1.de6dcap-1f, 0x1.045730p-1f,
      0x1.52f01cp-4f, -0x1.ca885ap-3f, -0x1.4ce438p-1f, -0x1.13853cp+0f, -0x1.8f2f54p+0f, 0x1.37c890p+0f,
      0x1.956780p-1f, 0x1.b5a52ap-2f, 0x1.dc862cp-5f, -0x1.77cec4p-2f, -0x1.c055a0p-1f, -0x1.3c03bap+0f,
      0x1.80922ap+0f, 0x1.193cc8p+0f, 0x1.7ab958p-1f, 0x1.cd422ap-3f, -0x1.98619cp-3f, -0x1.19a3f8p-1f,
      -0x1.de1e68p-1f, -0x1.5c20aap+0f, 0x1.6c69cep+0f, 0x1.de6180p-1f});
}

TEST_CASE("Adam with L2 weight decay matches PyTorch bit for bit") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<Adam>(ps, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  });
  check_bits(got, {-0x1.880ce8p+0f, 0x1.8e3658p-2f, -0x1.a2a64cp-1f, 0x1.1b158cp+0f, -0x1.a8b5b8p-4f, -0x1.66b8a0p+0f,
       0x1.100e02p-1f, -0x1.592f30p-1f, 0x1.434c6ep+0f, -0x1.3e5a34p-5f, -0x1.3f7188p+0f, 0x1.599e70p-1f,
       -0x1.1030b4p-1f, 0x1.637c62p+0f, 0x1.a7f362p-4f, -0x1.1a5638p+0f, 0x1.ab4c28p-1f, -0x1.8e6b6cp-2f,
       0x1.880694p+0f, 0x1.f70d90p-3f, -0x1.eb7994p-1f, 0x1.fed250p-1f, -0x1.4ae576p-2f, -0x1.883112p+0f,
       0x1.a07fd6p-2f, -0x1.a26f80p-1f, 0x1.1a5988p+0f, -0x1.714aaep-3f, -0x1.637424p+0f, 0x1.28a242p-1f,
       -0x1.74aea8p-1f, 0x1.3ee1bep+0f});
}

TEST_CASE("SGD with momentum, dampening, weight decay and nesterov matches PyTorch") {
  auto got = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01});
  });
  check_bits(got, {-0x1.29be2ap-2f, -0x1.316550p-3f, -0x1.2fc90ap-1f, 0x1.da3610p-1f, 0x1.ed8cb4p-2f, -0x1.57115cp+0f,
       0x1.6f719ep-3f, -0x1.0f26a0p-2f, 0x1.4135e6p+0f, -0x1.227d42p-1f, -0x1.02f67cp+0f, 0x1.041224p-1f,
       0x1.05135ep-4f, 0x1.a4a0c4p-3f, -0x1.e91e20p-3f, -0x1.5db73ep-1f, 0x1.ac47dcp-1f, 0x1.91b04ep-2f,
       0x1.115de8p-1f, 0x1.6f719ep-4f, -0x1.6b0304p-2f, 0x1.2a3ecep+0f, -0x1.506b78p-1f, -0x1.19ed96p+0f,
       0x1.ac47dcp-2f, -0x1.a978bap-6f, 0x1.d9cfdep-4f, -0x1.506b78p-2f, -0x1.8ba574p-1f, 0x1.7e59aap-1f,
       -0x1.1347b4p+0f, 0x1.c6df6ap-2f});
  auto nest = run_steps([](std::vector<Tensor> ps) {
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  });
  check_bits(nest, {0x1.c9ebcap-3f, -0x1.9be058p-2f, -0x1.0e14aap-1f, 0x1.cf6f38p-1f, 0x1.8f4ab8p-1f, -0x1.676464p+0f,
       0x1.d7639ap-6f, -0x1.8b4b1cp-4f, 0x1.560d40p+0f, -0x1.b1f900p-1f, -0x1.f21d82p-1f, 0x1.d6cccap-2f,
       0x1.5683c6p-2f, -0x1.2a5274p-2f, -0x1.aa9b74p-2f, -0x1.15723ap-1f, 0x1.c811aap-1f, 0x1.87ed2cp-1f,
       0x1.1e0842p-3f, 0x1.d7639ap-7f, -0x1.c6377ep-4f, 0x1.525e78p+0f, -0x1.b9568ep-1f, -0x1.f97b10p-1f,
       0x1.c811aap-2f, 0x1.47c8aep-2f, -0x1.390d88p-2f, -0x1.b9568ep-2f, -0x1.1ccfc8p-1f, 0x1.c0b41ep-1f,
       -0x1.4eafb2p+0f, 0x1.0091fcp-3f});
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

TEST_CASE("options are checked wherever they are set: constructor, set_option, load_state_dict") {
  using Catch::Contains;
  Tensor a = ones({2}).set_requires_grad();
  CHECK_THROWS_WITH(SGD(std::vector<Tensor>{}, {}), Contains("SGD: no parameters given"));
  CHECK_THROWS_WITH(AdamW(std::vector<ParamGroup>{{{}, {}}}, {}), Contains("AdamW: no parameters given"));
  CHECK_THROWS_WITH(SGD({a}, {.lr = HUGE_VAL}), Contains("option \"lr\" must be a finite number, got inf"));
  CHECK_THROWS_WITH(SGD({a}, {.momentum = 0.9, .dampening = std::nan("")}), Contains("\"dampening\" must be a finite"));
  AdamW opt({a}, {.lr = 0.1});
  CHECK_THROWS_WITH(opt.set_lr(std::nan("")), Contains("AdamW: option \"lr\" must be a finite number, got nan"));
  CHECK_THROWS_WITH(opt.set_lr(-1), Contains("learning rate must be >= 0, got -1"));
  CHECK_THROWS_WITH(opt.set_option(0, "beta1", 1.0), Contains("betas must be in [0, 1), got (1, 0.999)"));
  CHECK_THROWS_WITH(opt.set_option(0, "eps", -1), Contains("eps and weight_decay must be >= 0"));
  CHECK(opt.lr() == 0.1);  // nothing was changed
  CHECK_THROWS_WITH(opt.params(3), Contains("AdamW: no parameter group 3 (have 1)"));
  a.set_grad(ones({2}));
  opt.step();
  const NamedTensorList good = opt.state_dict();
  auto edited = [&](const std::string& key, std::optional<Tensor> value) {
    NamedTensorList out;
    for (auto& [k, t] : good)
      if (k != key) out.emplace_back(k, t);
      else if (value) out.emplace_back(k, *value);
    return out;
  };
  auto scalar = [](double v) { return scalar_tensor(v, {.dtype = DType::f64}); };
  AdamW other({ones({2}).set_requires_grad()}, {});
  CHECK_THROWS_WITH(other.load_state_dict(edited("param_groups.0.lr", scalar(std::nan("")))),  // NaN parameters, next step
                    Contains("AdamW.load_state_dict: \"param_groups.0.lr\" holds nan at element 0"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("param_groups.0.lr", scalar(-1))), Contains("learning rate must be >= 0"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("state.0.exp_avg", Tensor())), Contains("\"state.0.exp_avg\" is an undefined"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("param_groups.0.beta1", scalar(3))), Contains("betas must be in"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("param_groups.0.num_params", scalar(1.7))),
                    Contains("group 0 has 1.7 parameters in the checkpoint but 1 here"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("state.0.step", std::nullopt)),  // had dropped exp_avg silently
                    Contains("AdamW.load_state_dict: state.0.* holds exp_avg, exp_avg_sq, not exp_avg, exp_avg_sq, step"));
  NamedTensorList extra = good;
  extra.emplace_back("state.0.foo", ones({2}));
  CHECK_THROWS_WITH(other.load_state_dict(extra), Contains("unknown state \"state.0.foo\" (a parameter's state is exp_avg, exp_avg_sq, step)"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("state.0.step", scalar_tensor(0.5))),
                    Contains("state \"state.0.step\" is 0.5: a step count is one whole number below 2^53"));
  CHECK_THROWS_WITH(other.load_state_dict(edited("state.0.step", scalar_tensor(1e30))), Contains("is 1.0000000150474662e+30"));
  other.load_state_dict(good);
  CHECK(other.lr() == 0.1);
  CHECK_THROWS_WITH(StepLR(other, 1, std::nan("")), Contains("gamma a finite number >= 0, got 1 and nan"));
  CHECK_THROWS_WITH(StepLR(other, 1, -1), Contains("gamma a finite number >= 0"));
  CHECK_THROWS_WITH(CosineAnnealingLR(other, 10, -1), Contains("eta_min a finite number >= 0, got 10 and -1"));
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
  for (auto& [k, t] : bad)
    if (k == "state.0.exp_avg") t = ones({7});
  CHECK_THROWS_WITH(opt2.load_state_dict(bad), Catch::Contains("shape"));
  std::filesystem::remove_all(dir);
}

// The rvalue load keeps the tensors it is given (a checkpoint's, read for it), but not another optimizer's live state:
// o2.load_state_dict(o1.state_dict()) had shared exp_avg, exp_avg_sq and step with o1, so each stepped the other's.
TEST_CASE("an optimizer loaded from another's state_dict() owns its state: both step alike") {
  manual_seed(6);
  Linear a(3, 2), b(3, 2);
  AdamW o1(a.parameters(), {.lr = 0.1}), o2(b.parameters(), {.lr = 0.1});
  const Tensor x = randn({4, 3});
  auto step = [&](Linear& m, AdamW& o) {
    o.zero_grad();
    sum(square(m(x))).backward();
    o.step();
  };
  step(a, o1);
  b.load_state_dict(a.state_dict());
  o2.load_state_dict(o1.state_dict());  // a temporary: the rvalue overload
  for (int i = 0; i < 2; ++i) step(a, o1), step(b, o2);
  CHECK(to_vector(a.weight) == to_vector(b.weight));
  const auto s1 = o1.state_dict(), s2 = o2.state_dict();
  for (size_t i = 0; i < s1.size(); ++i) {
    INFO(s1[i].first);
    CHECK((s1[i].second.storage() != s2[i].second.storage() && to_vector(s1[i].second) == to_vector(s2[i].second)));
  }
}

TEST_CASE("a step that cannot run changes nothing; a strided parameter steps as its contiguous copy") {
  for (const bool adam : {true, false}) {
    INFO((adam ? "Adam" : "SGD with momentum"));
    auto make = [adam](std::vector<Tensor> ps) -> std::unique_ptr<Optimizer> {
      if (adam) return std::make_unique<Adam>(std::move(ps), AdamOptions{.lr = 0.1});
      return std::make_unique<SGD>(std::move(ps), SGDOptions{.lr = 0.1, .momentum = 0.9});
    };
    // A bf16 parameter after an f32 one: refused before the f32 one moves or any state is made.
    Tensor a = ones({4}).set_requires_grad(), b = ones({4}).to(DType::bf16).set_requires_grad();
    auto opt = make({a, b});
    a.set_grad(ones({4})), b.set_grad(ones({4}).to(DType::bf16));
    CHECK_THROWS_WITH(opt->step(), Catch::Contains("parameter 1 of group 0 is") && Catch::Contains("f32 or f64"));
    CHECK(to_vector(a) == std::vector<double>(4, 1.0));
    for (const auto& [key, t] : opt->state_dict()) CHECK_FALSE(key.starts_with("state."));  // options only
    // State of another dtype than its parameter (converted after a step): refused, nothing stepped.
    Linear lin(3, 2);
    auto opt2 = make(lin.parameters());
    for (Tensor& p : lin.parameters()) p.set_grad(ones_like(p));
    opt2->step();
    lin.to(DType::f64);
    for (Tensor& p : lin.parameters()) p.set_grad(ones_like(p));
    const std::vector<double> w = to_vector(lin.weight);
    CHECK_THROWS_WITH(opt2->step(), Catch::Contains("must match the parameter"));
    CHECK(to_vector(lin.weight) == w);
    // A transposed leaf steps as a contiguous parameter of the same values and gradients.
    Tensor strided = from_vector({1, 2, 3, 4, 5, 6}, {3, 2}).t().detach().set_requires_grad();
    Tensor plain = strided.contiguous().detach().set_requires_grad();
    auto o1 = make({strided}), o2 = make({plain});
    for (int k = 0; k < 3; ++k) {
      strided.set_grad(plain.detach() * 0.5 + 1.0), plain.set_grad(plain.detach() * 0.5 + 1.0);
      o1->step(), o2->step();
    }
    CHECK(to_vector(strided.contiguous()) == to_vector(plain));
  }
  Tensor p = ones({1}).set_requires_grad();
  SGD opt({p}, {.lr = 1.0});
  CHECK_THROWS_WITH(LinearLR(opt, 0.5, 1.0, 0), Catch::Contains("total_iters"));  // torch keeps start_factor for ever
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
  cos.step();  // at step 6: past t_max the cosine goes on, as PyTorch's closed form (the lr of step 2)
  CHECK(opt2.lr() == Approx(1.0));
  // eta_min per group, as PyTorch: each group's lr goes from its own base to eta_min (any base, 0 too).
  Tensor p2 = zeros({1}).set_requires_grad();
  SGD groups(std::vector<ParamGroup>{{{p}, {{"lr", 0.1}}}, {{p2}, {{"lr", 0.5}}}}, {.lr = 1.0});
  CosineAnnealingLR two(groups, 8, 0.01);
  for (int64_t step = 0; step <= 8; ++step) {
    two.set_last_step(step);
    const double c = (1 + std::cos(M_PI * double(step) / 8)) / 2;
    CHECK(groups.lr(0) == Approx(0.01 + (0.1 - 0.01) * c));
    CHECK(groups.lr(1) == Approx(0.01 + (0.5 - 0.01) * c));
  }
  SGD zero({p}, {.lr = 0.0});
  CosineAnnealingLR from_zero(zero, 4, 0.1);
  from_zero.set_last_step(4);
  CHECK(zero.lr() == Approx(0.1));
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
  // The other decays from the same warmup: lr at steps 0, 2 (the peak), 6 (half way), 8, 10, 12.
  using D = WarmupDecayLR::Decay;
  auto at = [&](D d, int64_t decay_steps, std::vector<double> want) {
    SGD o({p}, {.lr = 1.0});
    WarmupDecayLR s(o, 2, 10, 0.1, d, decay_steps);
    const std::vector<int64_t> steps{0, 2, 6, 8, 10, 12};
    for (size_t i = 0; i < steps.size(); ++i) {
      s.set_last_step(steps[i]);
      INFO("decay " << int(d) << " at step " << steps[i]);
      CHECK(o.lr() == Approx(want[i]));
    }
  };
  at(D::constant, 0, {0.5, 1, 1, 1, 1, 1});
  at(D::linear, 0, {0.5, 1, 0.55, 0.325, 0.1, 0.1});
  at(D::cosine, 0, {0.5, 1, 0.55, 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.75)), 0.1, 0.1});
  at(D::wsd, 4, {0.5, 1, 1, 0.55, 0.1, 0.1});  // stable to step 6, then linear over the last 4
  SGD o5({p}, {.lr = 1.0});
  WarmupDecayLR longer(o5, 10, 4, 0.1, D::cosine);  // a warmup past the run: (step + 1) / 10 to the end
  for (int64_t step = 0; step < 4; ++step) {
    longer.set_last_step(step);
    CHECK(o5.lr() == Approx(double(step + 1) / 10));
  }
  // wsd without decay steps (a warmup as long as the run): the warmup, then the peak to the end.
  SGD o6({p}, {.lr = 1.0});
  WarmupDecayLR no_decay(o6, 3, 5, 0.1, D::wsd, 0);
  for (int64_t step = 0; step < 5; ++step) {
    no_decay.set_last_step(step);
    CHECK(o6.lr() == Approx(std::min(1.0, double(step + 1) / 3)));
  }
  SGD o7({p}, {.lr = 1.0});  // one scheduler at a time per optimizer: o5 and o6 have theirs
  CHECK_THROWS_WITH(WarmupDecayLR(o7, 2, 10, 0.1, D::wsd, 9), Catch::Contains("wsd needs 0 <= decay_steps <= total - warmup"));
  CHECK_THROWS_WITH(WarmupDecayLR(o7, 2, 10, 0.1, D::wsd, -1), Catch::Contains("wsd needs"));
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
  // A NaN gradient gives a NaN norm for every norm type (the max norm had dropped it: 0 for {nan, nan} and {3})
  a.set_grad(from_vector({NAN, NAN}, {2}));
  b.set_grad(from_vector({3}, {1}));
  CHECK(std::isnan(clip_grad_norm_({a, b}, 100.0, INFINITY)));
  CHECK(std::isnan(clip_grad_norm_({b, a}, 100.0, INFINITY)));
  CHECK(std::isnan(clip_grad_norm_({a, b}, 100.0)));
  // ... and, as torch's clamp(max_norm / norm, max=1), turns every gradient to NaN (they had been left unclipped).
  CHECK(std::isnan(to_vector(b.grad())[0]));
  b.set_grad(from_vector({3}, {1}));
  CHECK(clip_grad_coefficient({b}, 1.0).coef == Approx(1 / (3 + 1e-6)));
  a.set_grad(from_vector({NAN, 1}, {2}));
  CHECK(std::isnan(clip_grad_coefficient({a, b}, 1.0).coef));
}

// The trainer clips by handing clip_grad_coefficient's factor to step_scaled, which applies it as
// the update reads each gradient: the same parameters and state, bit for bit, as clip_grad_norm_
// then step(), with the gradients left as they were (one pass over them fewer).
TEST_CASE("step_scaled(clip_grad_coefficient) is clip_grad_norm_ then step(), bit for bit") {
  auto grads = [](const std::vector<Tensor>& ps, int k) {
    for (size_t i = 0; i < ps.size(); ++i) {
      std::vector<double> g;
      for (int j = 0; j < 40; ++j) g.push_back(std::sin(0.37 * j + double(i) + k) * (j % 7 + 1) / 3.0);
      ps[i].set_grad(from_vector(g, {40}));
    }
  };
  auto make = [](const std::string& kind, std::vector<Tensor> ps) -> std::unique_ptr<Optimizer> {
    if (kind == "adamw") return std::make_unique<AdamW>(ps, AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
    if (kind == "adam") return std::make_unique<Adam>(ps, AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
    return std::make_unique<SGD>(ps, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  };
  for (const std::string kind : {"adamw", "adam", "sgd"}) {
    INFO(kind);
    std::vector<Tensor> a, b;
    for (int i = 0; i < 2; ++i) {
      Tensor p = randn({40});
      a.push_back(p.clone().set_requires_grad()), b.push_back(p.clone().set_requires_grad());
    }
    auto oa = make(kind, a), ob = make(kind, b);
    for (int k = 0; k < 3; ++k) {
      grads(a, k), grads(b, k);
      const std::vector<double> before = to_vector(b[0].grad());
      const double na = clip_grad_norm_(a, 1.5);
      oa->step();
      const GradClip c = clip_grad_coefficient(b, 1.5);
      CHECK(c.norm == na);
      CHECK(c.coef < 1.0);  // clipping is on: the factor matters
      ob->step_scaled(c.coef);
      CHECK(to_vector(b[0].grad()) == before);  // read, not written
      for (int i = 0; i < 2; ++i) CHECK(to_vector(a[i]) == to_vector(b[i]));
    }
  }
  // Below max_norm the factor is 1, and an optimizer whose step() does not scale gets its gradients scaled first.
  Tensor p = ones({2}).set_requires_grad();
  p.set_grad(from_vector({3, 4}, {2}));
  CHECK(clip_grad_coefficient({p}, 10.0).coef == 1.0);
  struct Plain : Optimizer {
    explicit Plain(std::vector<Tensor> ps) : Optimizer("Plain", {{ps, {}}}, {{"lr", 1.0}}) {}
    void step() override { seen = to_vector(groups_[0].params[0].grad()); }
    std::vector<double> seen;
  } plain({p});
  plain.step_scaled(0.5);
  CHECK(plain.seen == std::vector<double>{1.5, 2.0});
  CHECK_THROWS_WITH(plain.step_scaled(INFINITY), Catch::Matchers::Contains("the gradients' scale must be finite"));
  plain.step_scaled(NAN);  // a NaN norm's factor: NaN gradients, as clip_grad_norm_ makes them
  CHECK((std::isnan(plain.seen[0]) && std::isnan(plain.seen[1])));
  CHECK_THROWS_WITH(plain.step_scaled(-1), Catch::Matchers::Contains("a negative one steps up the gradient"));
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH(sgd.set_option(0, "nesterov", 0.5), Catch::Matchers::Contains("nesterov is a flag (0 or 1), got 0.9, 0 and 0.5"));
}

TEST_CASE("load_state_dict names a per-parameter state the optimizer does not hold, before its shape") {
  Tensor p = zeros({3}).set_requires_grad();
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9});
  NamedTensorList sd = sgd.state_dict();
  sd.emplace_back("state.0.momentum_bufer", zeros({3}));  // a misspelling had been carried along
  CHECK_THROWS_WITH(sgd.load_state_dict(sd), Catch::Matchers::Contains("unknown state \"state.0.momentum_bufer\""));
  Adam adam({p}, {.lr = 0.1});
  NamedTensorList ad = adam.state_dict();
  ad.emplace_back("state.0.foo", zeros({1}));
  CHECK_THROWS_WITH(adam.load_state_dict(ad), Catch::Matchers::Contains("unknown state \"state.0.foo\""));
}

TEST_CASE("an optimizer takes one scheduler at a time") {
  Tensor p = ones({1}).set_requires_grad();
  SGD opt({p}, {.lr = 1.0});
  {
    LinearLR warm(opt, 0.5, 1.0, 2);
    // A second had taken the first's step-0 lr as its base and overridden it at every step (0.25, 0.125, ...).
    CHECK_THROWS_WITH(StepLR(opt, 1, 0.5), Catch::Contains("LRScheduler: the optimizer has a scheduler already"));
  }
  StepLR after(opt, 1, 0.5);  // once the first is gone, another may own lr
  after.step();
  CHECK(opt.lr() == 0.25);  // its base: the lr the first left (0.5)
}
