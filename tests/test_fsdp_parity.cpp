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

// Trains `steps` AdamW steps with FSDP and without; compares losses and full parameters.
template <class Model, class MakeBatch, class Shard>
void run_parity(MakeBatch make_batch, int64_t rows, Shard shard, int steps = 6, int micro = 1) {
  manual_seed(7);
  auto ref = std::make_shared<Model>();
  manual_seed(7);
  auto model = std::make_shared<Model>();
  auto root = shard(model);
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2});
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  for (int step = 0; step < steps; ++step) {
    ref_opt.zero_grad();
    opt.zero_grad();
    double ref_loss = 0, loss = 0;
    for (int m = 0; m < micro; ++m) {
      Batch global = make_batch(step * micro + m, rows);
      Tensor l_ref = loss_of(*ref, global) * (1.0 / micro);
      l_ref.backward();
      ref_loss += l_ref.item();
      root.set_requires_gradient_sync(m == micro - 1);
      Tensor l = loss_of(*model, slice(global)) * (1.0 / micro);
      l.backward();
      loss += l.item();
    }
    ref_opt.step();
    opt.step();
    check_close({global_mean(loss)}, {ref_loss}, 1e-5, fmt::format("loss at step {}", step));
  }
  for (auto& [name, p] : ref->named_parameters())
    check_close(to_vector(root.full_tensor(name)), to_vector(p), 1e-5, "parameter " + name);
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
