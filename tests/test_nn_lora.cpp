// Tests for nn::apply_lora / merge_lora: the adapter's term and its gradients against the
// formula computed by hand, peft's initialisation, dropout on the adapter's input only,
// frozen base parameters, deferred (meta) construction, merging, and the errors.
#include <catch2/catch.hpp>

#include "test_util.h"
#include "weft.h"

using namespace weft;
using namespace weft::nn;
using Catch::Contains;

namespace {
struct LoRABlock : Module {
  std::shared_ptr<Linear> q_proj, o_proj;
  std::shared_ptr<LayerNorm> norm;
  LoRABlock(Generator* gen) : Module("Block") {
    q_proj = register_module("q_proj", std::make_shared<Linear>(6, 5, true, gen));
    o_proj = register_module("o_proj", std::make_shared<Linear>(5, 4, false, gen));
    norm = register_module("norm", std::make_shared<LayerNorm>(6));
  }
  Tensor forward(const Tensor& x) override { return (*o_proj)((*q_proj)((*norm)(x))); }
  using Module::forward;
};

Tensor param(Module& m, const std::string& name) {
  for (auto& [n, t] : m.named_parameters())
    if (n == name) return t;
  FAIL("no parameter " << name);
  return {};
}

LoRAOptions opts(std::vector<std::string> targets, double dropout = 0) {
  return {.rank = 3, .alpha = 6, .dropout = dropout, .targets = std::move(targets)};
}
}  // namespace

TEST_CASE("LoRA adds (alpha / r) B A x, starts as its base and trains only its adapters") {
  Generator gen(7);
  LoRABlock m(&gen);
  Tensor x = randn({2, 3, 6}, {}, &gen);
  Tensor base_out = m(x).detach().clone();
  auto adapted = apply_lora(m, opts({"q_proj"}), &gen);
  CHECK(adapted == std::vector<std::string>{"q_proj"});
  test::check_same_bits(base_out, m(x).detach(), "output with lora_B zero");  // B = 0: the base
  Tensor A = param(m, "q_proj.lora_A.weight"), B = param(m, "q_proj.lora_B.weight");
  CHECK(A.shape() == Shape{3, 6});
  CHECK(B.shape() == Shape{5, 3});
  // peft's lora_A: kaiming_uniform(a = sqrt(5)), U(-1/sqrt(in), 1/sqrt(in)).
  double bound = 1 / std::sqrt(6.0), largest = 0;
  for (double v : to_vector(A)) largest = std::max(largest, std::fabs(v));
  CHECK(largest <= bound);
  CHECK(largest > bound / 2);
  for (double v : to_vector(B)) CHECK(v == 0);
  {
    NoGradGuard no_grad;
    B.copy_(randn({5, 3}, {}, &gen));
  }
  for (auto& [name, t] : m.named_parameters()) CHECK(t.requires_grad() == is_lora_parameter(name));

  // The same computation written out, on copies of every parameter.
  auto leaf = [](const std::string& n, Module& mod) { return param(mod, n).detach().clone().set_requires_grad(true); };
  Tensor w = leaf("q_proj.weight", m), b = leaf("q_proj.bias", m), a2 = leaf("q_proj.lora_A.weight", m),
         b2 = leaf("q_proj.lora_B.weight", m), ow = leaf("o_proj.weight", m);
  Tensor h = (*m.norm)(x).detach();
  Tensor want = linear(linear(h, w, b) + 2.0 * linear(linear(h, a2, {}), b2, {}), ow, {});
  Tensor got = m(x);
  test::check_values(got, to_vector(want), 1e-6, 1e-6);
  sum(got * got).backward();
  sum(want * want).backward();
  test::check_values(A.grad(), to_vector(a2.grad()), 1e-5, 1e-6);
  test::check_values(B.grad(), to_vector(b2.grad()), 1e-5, 1e-6);
  for (const char* frozen : {"q_proj.weight", "q_proj.bias", "o_proj.weight", "norm.weight", "norm.bias"}) {
    INFO(frozen);
    CHECK_FALSE(param(m, frozen).grad().defined());
  }
}

TEST_CASE("LoRA's dropout drops the adapter's input only, and only in training") {
  Generator gen(3);
  LoRABlock m(&gen);
  Tensor x = randn({4, 6}, {}, &gen);
  Tensor base_out = m(x).detach().clone();
  apply_lora(m, opts({"q_proj", "o_proj"}, 0.5), &gen);
  test::check_same_bits(base_out, m(x).detach(), "training output with lora_B zero");  // the base is never dropped
  {
    NoGradGuard no_grad;
    for (const char* n : {"q_proj.lora_B.weight", "o_proj.lora_B.weight"}) param(m, n).copy_(randn({n[0] == 'q' ? 5 : 4, 3}, {}, &gen));
  }
  m.eval();
  Tensor eval_out = m(x).detach().clone();
  test::check_same_bits(eval_out, m(x).detach(), "evaluation output, twice");
  m.train();
  double most = 0;
  std::vector<double> e = to_vector(eval_out), t = to_vector(m(x).detach());
  for (size_t i = 0; i < e.size(); ++i) most = std::max(most, std::fabs(e[i] - t[i]));
  CHECK(most > 1e-3);
}

TEST_CASE("LoRA on a meta model materialises to the adapters made eagerly, bit for bit") {
  Generator g1(11), g2(11);
  LoRABlock eager(&g1);
  apply_lora(eager, opts({"o_proj"}), &g1);
  std::unique_ptr<LoRABlock> deferred;
  {
    DefaultDeviceGuard meta(Device::meta());
    deferred = std::make_unique<LoRABlock>(&g2);
  }
  apply_lora(*deferred, opts({"o_proj"}), &g2);
  CHECK(param(*deferred, "o_proj.lora_A.weight").device().is_meta());
  materialize(*deferred);
  for (auto& [name, t] : eager.named_parameters()) test::check_same_bits(t, param(*deferred, name), name);
}

TEST_CASE("merge_lora folds each adapter into its weight and drops the adapters") {
  Generator gen(5);
  LoRABlock m(&gen);
  apply_lora(m, opts({"q_proj", "o_proj"}), &gen);
  {
    NoGradGuard no_grad;
    param(m, "q_proj.lora_B.weight").copy_(randn({5, 3}, {}, &gen));
    param(m, "o_proj.lora_B.weight").copy_(randn({4, 3}, {}, &gen));
  }
  Tensor x = randn({3, 6}, {}, &gen);
  Tensor adapted_out = m(x).detach();
  NamedTensorList merged = merge_lora(m.state_dict(), opts({"q_proj", "o_proj"}));
  for (auto& [name, t] : merged) CHECK_FALSE(is_lora_parameter(name));
  Generator other(99);
  LoRABlock plain(&other);
  plain.load_state_dict(merged);  // strict: exactly the plain model's keys
  test::check_values(plain(x), to_vector(adapted_out), 1e-5, 1e-6);

  NamedTensorList broken = m.state_dict();
  std::erase_if(broken, [](auto& e) { return e.first == "o_proj.lora_B.weight"; });
  CHECK_THROWS_WITH(merge_lora(broken, opts({"o_proj"})),
                    Contains("has o_proj.lora_A.weight but no o_proj.lora_B.weight"));
  LoRAOptions other_rank = opts({"q_proj", "o_proj"});  // rank 3: the scale alpha / r would be another
  other_rank.rank = 4;
  CHECK_THROWS_WITH(merge_lora(m.state_dict(), other_rank), Contains("merge_lora: q_proj.lora_A.weight is shaped "
                                                                      "[3, 6]: not an adapter of rank 4"));
}

TEST_CASE("apply_lora refuses what it cannot adapt, naming it") {
  Generator gen(1);
  LoRABlock m(&gen);
  auto with = [](auto change) {
    LoRAOptions o = opts({"q_proj"});
    change(o);
    return o;
  };
  CHECK_THROWS_WITH(apply_lora(m, with([](LoRAOptions& o) { o.rank = 0; })), Contains("apply_lora: rank must be >= 1 (peft's \"r\"), got 0"));
  CHECK_THROWS_WITH(apply_lora(m, with([](LoRAOptions& o) { o.alpha = std::nan(""); })), Contains("alpha must be"));
  CHECK_THROWS_WITH(apply_lora(m, with([](LoRAOptions& o) { o.dropout = 1; })), Contains("dropout must be in [0, 1)"));
  CHECK_THROWS_WITH(apply_lora(m, with([](LoRAOptions& o) { o.targets.clear(); })), Contains("no target modules"));
  CHECK_THROWS_WITH(apply_lora(m, opts({"q_proj", "k_proj"})), Contains("target 'k_proj' names no module of the model (its Linear modules: q_proj, o_proj)"));
  CHECK_THROWS_WITH(apply_lora(m, opts({"norm"})), Contains("'norm' is a LayerNorm; only Linear modules"));
  for (auto& [name, t] : m.named_parameters()) CHECK(t.requires_grad());  // nothing was changed
  apply_lora(m, opts({"q_proj"}));
  CHECK_THROWS_WITH(apply_lora(m, opts({"q_proj"})), Contains("'q_proj' has an adapter already"));
  LoRABlock sharded(&gen);
  sharded.o_proj->set_extension(std::make_shared<ModuleExtension>());
  CHECK_THROWS_WITH(apply_lora(sharded, opts({"q_proj"})), Contains("fully_shard was applied to 'o_proj' already"));
}
