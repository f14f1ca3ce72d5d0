// FSDP semantics beyond plain parity: HSDP on a 2-D mesh, frozen and tied parameters, a module
// called twice (weight sharing) and a model twice before one backward, mixed precision, sharding on another dim, recovery from an exception in forward,
// bitwise repeatability, explicit prefetching, the errors for bad input, the checked training
// states and the state's lifetime with its module. Runs under
// mpirun at 1, 2 and 4 ranks.
#include <catch2/catch.hpp>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "fsdp/state.h"
#include "weft.h"

using namespace weft;

namespace {

struct Stack : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::Linear> head;
  bool tie, fail_in_block1 = false;
  explicit Stack(bool tie_ = false, bool frozen_first = false) : nn::Module("Stack"), tie(tie_) {
    wte = register_module("wte", std::make_shared<nn::Embedding>(9, 8));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 3; ++i) blocks->push_back(std::make_shared<nn::Block>(nn::TransformerConfig{.d_model = 8, .n_head = 2, .bias = false}));
    head = register_module("head", std::make_shared<nn::Linear>(8, 9, false));
    if (tie) head->set_parameter("weight", wte->weight);  // tied: one tensor, two names
    if (frozen_first) {
      auto b0 = blocks->at<nn::Block>(0);
      b0->ln_1->weight.set_requires_grad(false);
      b0->attn->c_attn->weight.set_requires_grad(false);
    }
  }
  Tensor forward(const Tensor& idx) override {
    Tensor h = (*wte)(idx);
    int i = 0;
    for (auto& b : *blocks) {
      WEFT_CHECK(!(fail_in_block1 && i == 1), "Stack: injected failure in block 1");
      h = (*b)(h);
      ++i;
    }
    return (*head)(h);
  }
  using nn::Module::forward;
};

struct Batch {
  Tensor x, y;
};
Batch batch(int step) {
  Generator g(500 + uint64_t(step));
  return {(rand({4, 6}, {}, &g) * 9.0).to(kInt64), (rand({4, 6}, {}, &g) * 9.0).to(kInt64)};
}
Batch slice(const Batch& b, int rank, int n) {
  int64_t rows = b.x.size(0) / n;
  return {b.x.narrow(0, rows * rank, rows), b.y.narrow(0, rows * rank, rows)};
}
Tensor loss_of(nn::Module& m, const Batch& b) {
  Tensor logits = m(b.x);
  return cross_entropy(logits.reshape({-1, logits.size(-1)}).to(kFloat32), b.y.reshape({-1}));
}
double mean_over(double v, const dist::ProcessGroupPtr& g) {
  Tensor t = from_vector({v}, {1}, {.dtype = kFloat64});
  g->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}
void check_close(const std::vector<double>& got, const std::vector<double>& want, const std::string& what,
                 double rtol = 1e-5, double atol = 1e-6) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::abs(got[i] - want[i]) - rtol * std::abs(want[i]);
    if (excess > worst) worst = excess, at = i;
  }
  INFO(what << ": worst element " << at << " (fsdp " << got[at] << ", reference " << want[at] << ")");
  CHECK(worst <= atol);
}

struct Options {
  fsdp::FullyShardOptions opts;
  bool tie = false, frozen = false;
  int steps = 5;
  double rtol = 1e-5, atol = 1e-6;
  std::function<void(Stack&, int)> before_step;  // e.g. inject a failure
};

// Trains the FSDP model (data split over the shard group x replicate group, i.e. over all
// ranks) and the reference; compares losses and parameters.
void parity(const Options& o) {
  manual_seed(11);
  auto ref = std::make_shared<Stack>(o.tie, o.frozen);
  manual_seed(11);
  auto model = std::make_shared<Stack>(o.tie, o.frozen);
  for (auto& b : *model->blocks) fsdp::fully_shard(b, o.opts);
  auto root = fsdp::fully_shard(model, o.opts);
  auto trainable = [](nn::Module& m) {
    std::vector<Tensor> out;
    for (auto& p : m.parameters())
      if (p.requires_grad()) out.push_back(p);
    return out;
  };
  nn::AdamW ref_opt(trainable(*ref), {.lr = 1e-2});
  nn::AdamW opt(trainable(*model), {.lr = 1e-2});
  for (int step = 0; step < o.steps; ++step) {
    if (o.before_step) o.before_step(*model, step);
    Batch global = batch(step);
    ref_opt.zero_grad();
    Tensor lr = loss_of(*ref, global);
    lr.backward();
    ref_opt.step();
    opt.zero_grad();
    Tensor l = loss_of(*model, slice(global, dist::rank(), dist::world_size()));
    l.backward();
    opt.step();
    check_close({mean_over(l.item(), dist::world())}, {lr.item()}, fmt::format("loss at step {}", step), o.rtol, o.atol);
  }
  for (auto& [name, p] : ref->named_parameters())
    check_close(to_vector(root.full_tensor(name)), to_vector(p), "parameter " + name, o.rtol, o.atol);
}

}  // namespace

TEST_CASE("HSDP: shard within groups of 2, replicate across them") {
  int n = dist::world_size(), shard = std::min(2, n);
  auto mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{n / shard, shard},
                                                 std::vector<std::string>{"replicate", "shard"});
  parity({.opts = {.mesh = mesh}});
}

TEST_CASE("frozen parameters share a group with trainable ones; tied parameters") {
  parity({.frozen = true});
  parity({.tie = true});
}

TEST_CASE("sharding on dim 1 through shard_placement_fn") {
  int n = dist::world_size();
  // Every Linear weight has an in-dim of 8 or 32, divisible by 1, 2 and 4.
  auto place = [](const std::string& name, const Tensor& p) -> int64_t {
    return name.find("c_fc.weight") != std::string::npos || name.find("c_attn.weight") != std::string::npos ? 1 : 0;
  };
  parity({.opts = {.shard_placement_fn = place}});
  if (n > 1) {
    manual_seed(1);
    auto m = std::make_shared<nn::Linear>(4, 3);
    CHECK_THROWS_WITH(fsdp::fully_shard(m, {.shard_placement_fn = [](const std::string&, const Tensor&) -> int64_t { return 1; }}),
                      Catch::Contains("divide evenly") || Catch::Contains("bias"));
  }
}

// Weight sharing: `a` runs twice in one forward (b(a(a(x)))), and the whole model may run twice
// before one backward (two micro-batches summed), or backward run twice through one graph (retain_graph).
// Each sharded module's post-backward waits for the gradients of all its calls.
struct Shared : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  Shared() : nn::Module("Shared") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 4));
    b = register_module("b", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor forward(const Tensor& x) override { return (*b)((*a)((*a)(x))); }
  using nn::Module::forward;
};

TEST_CASE("a module called twice in one forward, a model called twice before one backward, retain_graph") {
  const int n = dist::world_size();
  for (bool input_grad : {false, true})
    for (bool twice : {false, true})
      for (bool reshard : {true, false})
      for (bool retain : {false, true}) {
        INFO("input requires grad " << input_grad << ", model called twice " << twice << ", reshard " << reshard
             << ", a second backward through the graph " << retain);
        manual_seed(3);
        auto ref = std::make_shared<Shared>();
        manual_seed(3);
        auto m = std::make_shared<Shared>();
        fsdp::fully_shard(m->a, {.reshard_after_forward = reshard});
        fsdp::fully_shard(m->b);
        auto root = fsdp::fully_shard(m);
        nn::SGD ref_opt(ref->parameters(), {.lr = 0.1}), opt(m->parameters(), {.lr = 0.1});
        auto loss = [&](nn::Module& model, const Tensor& x) {  // the mean over x's rows of the squared outputs
          Tensor y = model(x), l = sum(y * y) / double(x.size(0));
          return twice ? l + sum(model(x * 0.5)) / double(x.size(0)) : l;
        };
        for (int step = 0; step < 2; ++step) {
          Generator g(40 + uint64_t(step));
          Tensor x = rand({2 * n, 4}, {}, &g) - 0.5, mine = x.narrow(0, 2 * dist::rank(), 2).contiguous();
          x.set_requires_grad(input_grad), mine.set_requires_grad(input_grad);
          ref_opt.zero_grad(), opt.zero_grad();
          Tensor lr = loss(*ref, x), lm = loss(*m, mine);
          if (retain) lr.backward({}, true), lm.backward({}, true);  // twice through one graph: both gradients add up
          lr.backward(), lm.backward();
          ref_opt.step(), opt.step();
        }
        for (auto& [name, p] : ref->named_parameters())
          check_close(to_vector(root.full_tensor(name)), to_vector(p), "parameter " + name);
      }
}

namespace {
// The backward of mean(y^2) for `ref` over a global batch [2 x ranks, 4] drawn from `seed`, and for the sharded `m`
// over this rank's two rows of it.
void backward_both(nn::Module& ref, nn::Module& m, uint64_t seed) {
  Generator g(seed);
  Tensor x = rand({2 * dist::world_size(), 4}, {}, &g) - 0.5, mine = x.narrow(0, 2 * dist::rank(), 2).contiguous();
  (sum(ref(x) * ref(x)) / double(x.size(0))).backward();
  (sum(m(mine) * m(mine)) / double(mine.size(0))).backward();
}
}  // namespace

// As FSDP2, requires_grad set after fully_shard is followed: a parameter frozen mid-training gets no more gradient
// and is not stepped, an unfrozen one trains (both had kept the flag they had when sharded). Ranks that change
// different parameters stop.
TEST_CASE("requires_grad changed after fully_shard: frozen or unfrozen mid-training") {
  const int n = dist::world_size();
  for (bool freeze : {true, false}) {
    INFO("frozen mid-training " << freeze << " (else unfrozen)");
    manual_seed(5);
    auto ref = std::make_shared<Shared>();
    manual_seed(5);
    auto m = std::make_shared<Shared>();
    auto set_flags = [](Shared& s, bool on) { s.a->weight.set_requires_grad(on), s.b->bias.set_requires_grad(on); };
    set_flags(*ref, freeze), set_flags(*m, freeze);
    fsdp::fully_shard(m->a);
    auto root = fsdp::fully_shard(m);
    nn::SGD ref_opt(ref->parameters(), {.lr = 0.1}), opt(m->parameters(), {.lr = 0.1});
    for (int step = 0; step < 4; ++step) {
      if (step == 2) set_flags(*ref, !freeze), set_flags(*m, !freeze);
      ref_opt.zero_grad(), opt.zero_grad();
      backward_both(*ref, *m, 60 + uint64_t(step));
      CHECK(m->a->weight.grad().defined() == ((step < 2) == freeze));
      ref_opt.step(), opt.step();
    }
    for (auto& [name, p] : ref->named_parameters())
      check_close(to_vector(root.full_tensor(name)), to_vector(p), "parameter " + name);
  }
  if (n < 2) {
    WARN("ranks that freeze different parameters need 2 ranks; checked under mpirun -np 2 and 4");
    return;
  }
  auto m = std::make_shared<Shared>();
  fsdp::fully_shard(m);
  sum((*m)(ones({2, 4}))).backward();
  (dist::rank() == 0 ? m->a->weight : m->b->weight).set_requires_grad(false);  // both [4, 4]
  CHECK_THROWS_WITH(sum((*m)(ones({2, 4}))).backward(), Catch::Contains("issue different collectives") &&
                                                           Catch::Contains("(frozen: "));
}

// b is used at the first step only (a branch a step passes by).
struct Branch : nn::Module {
  std::shared_ptr<nn::Linear> a, b;
  bool use_b = true;
  Branch() : nn::Module("Branch") {
    a = register_module("a", std::make_shared<nn::Linear>(4, 4));
    b = register_module("b", std::make_shared<nn::Linear>(4, 4));
  }
  Tensor forward(const Tensor& x) override { return use_b ? (*b)((*a)(x)) : (*a)(x); }
  using nn::Module::forward;
};

// A parameter no gradient reached on any rank keeps no gradient, and the optimizer passes over it as in one
// process (FSDP had given it zeros: AdamW decayed it and moved it on its old moments at every step).
TEST_CASE("parameters no gradient reached are not stepped; ranks that leave different ones stop") {
  const int n = dist::world_size();
  for (bool own_group : {true, false}) {
    INFO("b in a group of its own " << own_group);
    manual_seed(4);
    auto ref = std::make_shared<Branch>();
    manual_seed(4);
    auto m = std::make_shared<Branch>();
    if (own_group) fsdp::fully_shard(m->b);
    auto root = fsdp::fully_shard(m);
    nn::AdamW ref_opt(ref->parameters(), {.lr = 0.1, .weight_decay = 0.1}), opt(m->parameters(), {.lr = 0.1, .weight_decay = 0.1});
    std::vector<double> b_after_first;
    for (int step = 0; step < 3; ++step) {
      ref->use_b = m->use_b = step == 0;
      ref_opt.zero_grad(), opt.zero_grad();
      backward_both(*ref, *m, 50 + uint64_t(step));
      if (step > 0) CHECK(!m->b->weight.grad().defined());
      ref_opt.step(), opt.step();
      if (step == 0) b_after_first = to_vector(root.full_tensor("b.weight"));
    }
    CHECK(to_vector(root.full_tensor("b.weight")) == b_after_first);
    for (auto& [name, p] : ref->named_parameters())
      check_close(to_vector(root.full_tensor(name)), to_vector(p), "parameter " + name);
  }
  if (n < 2) {
    WARN("ranks that differ need 2 ranks; checked under mpirun -np 2 and 4");
    return;
  }
  auto m = std::make_shared<Branch>();
  fsdp::fully_shard(m);
  m->use_b = dist::rank() == 0;  // a data-dependent branch: rank 0 would step b, the others not
  CHECK_THROWS_WITH(sum((*m)(ones({2, 4}))).backward(), Catch::Contains("issue different collectives") &&
                                                           Catch::Contains("(no gradient: b.weight, b.bias)"));
}

TEST_CASE("an exception in the middle of forward, then normal steps") {
  parity({.before_step = [](Stack& m, int step) {
    if (step != 2) return;
    m.fail_in_block1 = true;
    Batch b = batch(99);
    CHECK_THROWS_WITH(loss_of(m, slice(b, dist::rank(), dist::world_size())), Catch::Contains("injected failure"));
    m.fail_in_block1 = false;
  }});
}

TEST_CASE("mixed precision: bf16 compute, f32 reduction and master weights") {
  manual_seed(11);
  auto model = std::make_shared<Stack>();
  // Blocks compute in bf16 and pass bf16 on; only the root's outputs go back to f32.
  fsdp::FullyShardOptions o{.mp_policy = {.param_dtype = kBFloat16, .reduce_dtype = kFloat32}};
  for (auto& b : *model->blocks) fsdp::fully_shard(b, o);
  o.mp_policy.output_dtype = kFloat32;
  fsdp::fully_shard(model, o);
  DType seen = kFloat32;
  model->blocks->at<nn::Block>(0)->mlp->c_fc->register_forward_pre_hook([&](nn::Module& m, const nn::TensorList& in) {
    seen = static_cast<nn::Linear&>(m).weight.dtype();
    CHECK(in[0].dtype() == kBFloat16);
    return std::nullopt;
  });
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    opt.zero_grad();
    Tensor l = loss_of(*model, slice(batch(0), dist::rank(), dist::world_size()));
    CHECK(l.dtype() == kFloat32);
    l.backward();
    for (auto& p : model->parameters()) {
      CHECK(p.dtype() == kFloat32);  // sharded master weights
      if (p.grad().defined()) CHECK(p.grad().dtype() == kFloat32);
    }
    opt.step();
    double g = mean_over(l.item(), dist::world());
    if (step == 0) first = g;
    last = g;
  }
  CHECK(seen == kBFloat16);
  CHECK(last < first);  // it learns the repeated batch
}

TEST_CASE("two runs with the same seed are bitwise identical") {
  auto run = [] {
    manual_seed(5);
    auto model = std::make_shared<Stack>();
    for (auto& b : *model->blocks) fsdp::fully_shard(b);
    auto root = fsdp::fully_shard(model);
    nn::AdamW opt(model->parameters(), {.lr = 1e-2});
    std::vector<double> trace;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      Tensor l = loss_of(*model, slice(batch(step), dist::rank(), dist::world_size()));
      l.backward();
      opt.step();
      trace.push_back(l.item());
    }
    for (double v : to_vector(root.full_tensor("blocks.1.mlp.c_fc.weight"))) trace.push_back(v);
    return trace;
  };
  CHECK(run() == run());
}

TEST_CASE("explicit prefetch, async unshard and reshard") {
  manual_seed(11);
  auto model = std::make_shared<Stack>();
  std::vector<fsdp::FSDPModule> blocks;
  for (auto& b : *model->blocks) blocks.push_back(fsdp::fully_shard(b));
  auto root = fsdp::fully_shard(model);
  for (size_t i = 0; i + 1 < blocks.size(); ++i) blocks[i].set_modules_to_forward_prefetch({blocks[i + 1]});
  for (size_t i = 1; i < blocks.size(); ++i) blocks[i].set_modules_to_backward_prefetch({blocks[i - 1]});
  auto before = root.comm_stats();
  Tensor l = loss_of(*model, slice(batch(0), dist::rank(), dist::world_size()));
  l.backward();
  auto after = root.comm_stats();
  CHECK(after.all_gathers - before.all_gathers == 4 + 3);  // 4 groups forward, 3 blocks again in backward
  CHECK(after.reduce_scatters - before.reduce_scatters == 4);
  // Manual unshard gives the full parameter in the module; reshard gives the shard back.
  auto b0 = model->blocks->at<nn::Block>(0);
  auto h = blocks[0].unshard(/*async_op=*/true);
  h.wait();
  CHECK(b0->mlp->c_fc->weight.shape() == Shape{32, 8});
  blocks[0].reshard();
  int n = dist::world_size();
  CHECK(b0->mlp->c_fc->weight.shape() == Shape{std::clamp<int64_t>(32 - dist::rank() * ((32 + n - 1) / n), 0, (32 + n - 1) / n), 8});
}

TEST_CASE("bad input: tied parameters split across groups, models that differ across ranks") {
  manual_seed(1);
  auto model = std::make_shared<Stack>();
  // Tie block 0's MLP weight to a parameter registered in the root.
  model->register_parameter("alias", Tensor());
  model->set_parameter("alias", model->blocks->at<nn::Block>(0)->mlp->c_fc->weight);
  fsdp::fully_shard(model->blocks->at<nn::Block>(0));
  CHECK_THROWS_WITH(fsdp::fully_shard(model), Catch::Contains("tied"));
  // The same tie between two sibling groups (block 1's weight is block 0's): the second call sees the replaced tensor
  // (it had untied them silently: two copies that drifted apart in training).
  auto siblings = std::make_shared<Stack>();
  auto b0 = siblings->blocks->at<nn::Block>(0), b1 = siblings->blocks->at<nn::Block>(1);
  b1->mlp->c_fc->set_parameter("weight", b0->mlp->c_fc->weight);
  fsdp::fully_shard(b0);
  CHECK_THROWS_WITH(fsdp::fully_shard(b1), Catch::Contains("mlp.c_fc.weight is tied to a parameter already sharded"));

  if (dist::world_size() == 1) {
    WARN("models differing across ranks need at least 2 ranks; checked under mpirun -np 2 and 4");
    return;
  }
  auto other = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, dist::rank() == 1 ? 5 : 6)});
  fsdp::fully_shard(other);
  CHECK_THROWS_WITH((*other)(ones({2, 4})), Catch::Contains("ranks hold different models") && Catch::Contains("rank 1"));
  // The same model sharded on another dim on one rank (a shard_placement_fn that reads the rank): each
  // rank had trained its own wrong model.
  auto placed = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 4)});
  fsdp::FullyShardOptions o;
  o.shard_placement_fn = [](const std::string& name, const Tensor&) { return name == "0.weight" ? dist::rank() % 2 : 0; };
  fsdp::fully_shard(placed, o);
  CHECK_THROWS_WITH((*placed)(ones({2, 4})), Catch::Contains("ranks hold different models") &&
                                                 Catch::Contains("sharded on dim"));
  // Ranks that freeze different parameters of the same shapes: each rank's gradient columns would hold another
  // parameter, averaged together.
  auto frozen = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Linear>(4, 4)});
  frozen->at<nn::Linear>(dist::rank() % 2)->weight.set_requires_grad(false);
  fsdp::fully_shard(frozen);
  CHECK_THROWS_WITH((*frozen)(ones({2, 4})), Catch::Contains("ranks hold different models") &&
                                                 Catch::Contains("0.weight [4, 4] f32"));
}

TEST_CASE("reshard_after_forward = 2: backward gathers within pairs of ranks") {
  int n = dist::world_size();
  if (n < 4) {
    WARN("resharding to a smaller world needs a divisor 1 < k < world size; checked under mpirun -np 4");
    return;
  }
  parity({.opts = {.reshard_after_forward = 2}});
  manual_seed(11);
  auto model = std::make_shared<Stack>();
  std::vector<fsdp::FSDPModule> blocks;
  for (auto& b : *model->blocks) blocks.push_back(fsdp::fully_shard(b, {.reshard_after_forward = 2}));
  auto root = fsdp::fully_shard(model);
  Tensor l = loss_of(*model, slice(batch(0), dist::rank(), n));
  // After forward each block keeps 1/2 of its parameters: more than a shard, less than all.
  auto b0 = model->blocks->at<nn::Block>(0);
  CHECK(b0->mlp->c_fc->weight.shape() == Shape{32 / n, 8});  // the registered shard again
  // Each block's group holds its 1/2 chunk: half the full parameter's elements, twice a shard's.
  for (auto& b : *model->blocks) {
    auto s = fsdp::state_of(*b);
    CHECK(s->group->state() == fsdp::FSDPParamGroup::State::partial);
  }
  auto before = root.comm_stats();
  l.backward();
  auto after = root.comm_stats();
  CHECK(after.all_gathers - before.all_gathers == 3);  // the blocks, within their pairs
  CHECK(after.reduce_scatters - before.reduce_scatters == 4);
  CHECK_THROWS_WITH(fsdp::fully_shard(std::make_shared<nn::Linear>(2, 2), {.reshard_after_forward = 3}),
                    Catch::Contains("must divide"));
  // FSDP2's non-trivial divisors only: 1 is `false`, the world size is `true`.
  CHECK_THROWS_WITH(fsdp::fully_shard(std::make_shared<nn::Linear>(2, 2), {.reshard_after_forward = 1}),
                    Catch::Contains("for 1 pass false"));
  CHECK_THROWS_WITH(fsdp::fully_shard(std::make_shared<nn::Linear>(2, 2), {.reshard_after_forward = n}),
                    Catch::Contains("pass true"));
}

TEST_CASE("training states: the hooks move through checked transitions") {
  manual_seed(3);
  auto model = std::make_shared<Stack>();
  for (auto& b : *model->blocks) fsdp::fully_shard(b);
  fsdp::fully_shard(model);
  auto block = model->blocks->at<nn::Block>(1);
  auto s = fsdp::state_of(*block);
  REQUIRE(s);
  CHECK(s->training_state() == fsdp::TrainingState::idle);
  // Hooks registered after fully_shard's run after its own: they see the state it set.
  std::vector<fsdp::TrainingState> seen;
  block->register_forward_pre_hook([&](nn::Module&, const nn::TensorList&) -> std::optional<nn::TensorList> {
    seen.push_back(s->training_state());
    return std::nullopt;
  });
  block->register_forward_hook([&](nn::Module&, const nn::TensorList&, const nn::TensorList& out) -> std::optional<nn::TensorList> {
    seen.push_back(s->training_state());
    out[0].register_hook([&](const Tensor&) {
      seen.push_back(s->training_state());
      return Tensor();
    });
    return std::nullopt;
  });
  Tensor loss = loss_of(*model, slice(batch(0), dist::rank(), dist::world_size()));
  loss.backward();
  using TS = fsdp::TrainingState;
  CHECK(seen == std::vector<TS>{TS::forward, TS::idle, TS::pre_backward});
  for (auto& m : model->modules())
    if (auto st = fsdp::state_of(*m)) CHECK(st->training_state() == TS::idle);  // reset at the end of backward

  // Out of order: a post-forward with no forward, a forward entered twice.
  Tensor h = rand({2, 6, 8});
  CHECK_THROWS_WITH(s->post_forward({h}), Catch::Contains("post-forward of module 'blocks.1'") &&
                                              Catch::Contains("from IDLE to IDLE") && Catch::Contains("only from FORWARD"));
  {
    NoGradGuard no_grad;
    s->pre_forward({h});
    CHECK(s->training_state() == TS::forward);
    CHECK_THROWS_WITH(s->pre_forward({h}), Catch::Contains("pre-forward of module 'blocks.1'") &&
                                               Catch::Contains("from FORWARD to FORWARD") && Catch::Contains("only from IDLE"));
    s->post_forward({h});
    CHECK(s->training_state() == TS::idle);
  }
  // The root's next forward starts from IDLE everywhere: training goes on.
  loss_of(*model, slice(batch(1), dist::rank(), dist::world_size())).backward();
  CHECK(s->training_state() == TS::idle);
}

TEST_CASE("the state is attached to its module and dies with it") {
  std::weak_ptr<fsdp::FSDPState> root_state, block_state;
  {
    manual_seed(3);
    auto model = std::make_shared<Stack>();
    for (auto& b : *model->blocks) fsdp::fully_shard(b);
    fsdp::fully_shard(model);  // the returned handle is dropped: the module holds the state
    root_state = fsdp::state_of(*model);
    block_state = fsdp::state_of(*model->blocks->at<nn::Block>(0));
    REQUIRE(!root_state.expired());
    REQUIRE(!block_state.expired());
    CHECK(model->extension() == root_state.lock());
    loss_of(*model, slice(batch(0), dist::rank(), dist::world_size())).backward();
    CHECK(!root_state.expired());
  }
  CHECK(root_state.expired());
  CHECK(block_state.expired());
  auto plain = std::make_shared<nn::Linear>(2, 2);
  CHECK(fsdp::state_of(*plain) == nullptr);
}
