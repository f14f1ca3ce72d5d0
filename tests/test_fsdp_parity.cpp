// FSDP parity: training with fully_shard at this world size gives the same losses and
// parameters as plain single-process training of the same seeded model on the same global
// batches (each rank takes its slice). Also the collective counts of a step, gradient
// accumulation, and the sharding layout. Runs under mpirun at 1, 2 and 4 ranks.
#include <catch2/catch.hpp>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "weft.h"
#include "fsdp_test_models.h"

using namespace weft;
using namespace weft::fsdp_test;
using nn::ModulePtr;

namespace {

// Trains `steps` AdamW steps with FSDP and without, syncing gradients on the last micro-batch;
// compares losses and full parameters.
template <class Model, class MakeBatch, class Shard>
void run_parity(MakeBatch make_batch, int64_t rows, Shard shard, int steps = 6, int micro = 1) {
  Parity<Model> run(shard);
  run.train(make_batch, rows, steps, micro,
            {.before_forward = [&](int, int m) { run.root.set_requires_gradient_sync(m == micro - 1); }});
  run.check_params(1e-5, "parity");
}

}  // namespace

TEST_CASE("parity: uneven MLP, one group per layer plus the root") {
  for (bool reshard : {true, false}) {
    INFO("reshard_after_forward " << reshard);
    run_parity<UnevenMLP>(mlp_batch, 8, [reshard](const std::shared_ptr<UnevenMLP>& m) {
      fsdp::FullyShardOptions o{.reshard_after_forward = reshard};
      fsdp::fully_shard(m->fc1, o);
      fsdp::fully_shard(m->fc2, o);
      return fsdp::fully_shard(m);
    });
  }
}

TEST_CASE("parity: small transformer, one group per block") {
  run_parity<TinyGPT>(gpt_batch, 4, [](const std::shared_ptr<TinyGPT>& m) {
    for (auto& b : *m->blocks) fsdp::fully_shard(b);
    return fsdp::fully_shard(m);
  });
}

TEST_CASE("parity: gradient accumulation over 4 micro-batches, syncing on the last") {
  run_parity<TinyGPT>(gpt_batch, 4, [](const std::shared_ptr<TinyGPT>& m) {
    for (auto& b : *m->blocks) fsdp::fully_shard(b);
    return fsdp::fully_shard(m);
  }, 3, 4);
}

// Two branches fed the same activations, summed: siblings that run side by side.
struct TwoBranch : nn::Module {
  std::shared_ptr<nn::Linear> pre, a, b, head;
  TwoBranch() : nn::Module("TwoBranch") {
    pre = register_module("pre", std::make_shared<nn::Linear>(7, 9));
    a = register_module("a", std::make_shared<nn::Linear>(9, 6));
    b = register_module("b", std::make_shared<nn::Linear>(9, 6));
    head = register_module("head", std::make_shared<nn::Linear>(6, 3));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu((*pre)(x));
    return (*head)((*a)(h) + relu((*b)(h)));
  }
  using nn::Module::forward;
};

TEST_CASE("fully_shard on a list: siblings run one after another form one group") {
  run_parity<TinyGPT>(gpt_batch, 4, [](const std::shared_ptr<TinyGPT>& m) {
    auto group = fsdp::fully_shard(std::vector<ModulePtr>{(*m->blocks)[0], (*m->blocks)[1]});
    CHECK(fsdp::fsdp_module(*(*m->blocks)[1])->state() == group.state());
    CHECK(group.shards("1.attn.c_attn.weight"));
    auto root = fsdp::fully_shard(m);
    // One all-gather for both blocks in a forward, and one reduce-scatter in backward.
    auto before = group.comm_stats(false);
    loss_of(*m, slice(gpt_batch(99, 4))).backward();
    CHECK(group.comm_stats(false).all_gathers - before.all_gathers == 2);  // forward, then backward
    CHECK(group.comm_stats(false).reduce_scatters - before.reduce_scatters == 1);
    for (auto& p : m->parameters()) p.set_grad(Tensor());
    return root;
  }, 4);
}

TEST_CASE("fully_shard on a list: siblings run side by side form one group") {
  run_parity<TwoBranch>(mlp_batch, 8, [](const std::shared_ptr<TwoBranch>& m) {
    fsdp::fully_shard(std::vector<ModulePtr>{m->a, m->b});
    return fsdp::fully_shard(m);
  }, 4);
}

TEST_CASE("fully_shard on a list: refused lists, and a forward that skips a member") {
  auto m = std::make_shared<TwoBranch>();
  CHECK_THROWS_WITH(fsdp::fully_shard(std::vector<ModulePtr>{}), Catch::Contains("list of modules is empty"));
  CHECK_THROWS_WITH(fsdp::fully_shard(std::vector<ModulePtr>{m->a, m->a}), Catch::Contains("is the same as"));
  CHECK_THROWS_WITH(fsdp::fully_shard(std::vector<ModulePtr>{m, m->a}), Catch::Contains("is inside"));
  fsdp::fully_shard(std::vector<ModulePtr>{m->a, m->b});
  fsdp::fully_shard(m);
  // Only `a` runs: the group never ends its forward, and backward says so.
  Tensor x = randn({2, 7});
  {
    NoGradGuard no_grad;
    (*m)(x);
  }
  Tensor h = randn({2, 9});
  h.set_requires_grad(true);
  Tensor out = (*m->a)(h);
  CHECK_THROWS_WITH(sum(out).backward(), Catch::Contains("ran only 1 of its 2 modules"));
  // The next forward starts clean.
  CHECK_NOTHROW(sum((*m)(x)).backward());
}

TEST_CASE("the registered parameters are this rank's shards; sharding metadata") {
  manual_seed(1);
  auto m = std::make_shared<UnevenMLP>();
  Tensor full_w = m->fc1->weight.clone();
  fsdp::fully_shard(m->fc1);
  auto root = fsdp::fully_shard(m);
  int n = dist::world_size(), r = dist::rank();
  int64_t chunk = (15 + n - 1) / n;
  int64_t rows = std::clamp<int64_t>(15 - r * chunk, 0, chunk);
  CHECK(m->fc1->weight.shape() == Shape{rows, 7});
  CHECK(m->named_parameters()[0].first == "fc1.weight");  // names unchanged
  auto info = root.shard_info("fc1.weight");
  CHECK(info.global_shape == Shape{15, 7});
  CHECK(info.offset == std::min<int64_t>(15, r * chunk));
  CHECK(info.length == rows);
  if (rows > 0) CHECK(to_vector(m->fc1->weight) == to_vector(full_w.narrow(0, r * chunk, rows)));
  CHECK(to_vector(root.full_tensor("fc1.weight")) == to_vector(full_w));
  CHECK_THROWS_WITH(fsdp::fully_shard(m->fc1), Catch::Contains("twice"));
}

TEST_CASE("collective counts per step") {
  manual_seed(3);
  auto m = std::make_shared<TinyGPT>();
  for (auto& b : *m->blocks) fsdp::fully_shard(b);
  auto root = fsdp::fully_shard(m);
  const int groups = 3;  // two blocks and the root
  for (int step = 0; step < 2; ++step) {
    auto before = root.comm_stats();
    Tensor l = loss_of(*m, slice(gpt_batch(step, 4)));
    auto after_fwd = root.comm_stats();
    CHECK(after_fwd.all_gathers - before.all_gathers == groups);
    l.backward();
    auto after = root.comm_stats();
    // Blocks are gathered again for backward; the root kept its parameters.
    CHECK(after.all_gathers - after_fwd.all_gathers == groups - 1);
    CHECK(after.reduce_scatters - before.reduce_scatters == groups);
  }
  // Accumulating without sync: no reduce-scatter.
  root.set_requires_gradient_sync(false);
  auto before = root.comm_stats();
  loss_of(*m, slice(gpt_batch(5, 4))).backward();
  CHECK(root.comm_stats().reduce_scatters == before.reduce_scatters);
  root.set_requires_gradient_sync(true);
}
