// FSDP parity: training with fully_shard at this world size gives the same losses and
// parameters as plain single-process training of the same seeded model on the same global
// batches (each rank takes its slice). Also the collective counts of a step, gradient
// accumulation, and the sharding layout. Runs under mpirun at 1, 2 and 4 ranks.
#include <catch2/catch.hpp>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "weft.h"

using namespace weft;
using nn::ModulePtr;

namespace {

// An MLP whose shapes do not divide by 2 or 4: (7 -> 15) and (15 -> 3).
struct UnevenMLP : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  UnevenMLP() : nn::Module("UnevenMLP") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(7, 15));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(15, 3));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
  using nn::Module::forward;
};

// A small GPT-like model: embedding, two pre-LN blocks, final norm, head. Without biases: the
// key projection's bias has an exactly-zero gradient in theory, so Adam would turn rounding
// noise into full-size steps that no two reduction orders agree on.
struct TinyGPT : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;
  TinyGPT() : nn::Module("TinyGPT") {
    nn::TransformerConfig cfg{.d_model = 12, .n_head = 3, .bias = false};
    wte = register_module("wte", std::make_shared<nn::Embedding>(11, 12));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<nn::Block>(cfg));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(12));
    head = register_module("head", std::make_shared<nn::Linear>(12, 11));
  }
  Tensor forward(const Tensor& idx) override {
    Tensor h = (*wte)(idx);
    for (auto& b : *blocks) h = (*b)(h);
    return (*head)((*ln_f)(h));
  }
  using nn::Module::forward;
};

struct Batch {
  Tensor x, y;
};

// Global batches, the same on every rank, and this rank's slice of one.
Batch mlp_batch(int step, int64_t rows) {
  Generator g(100 + uint64_t(step));
  Tensor x = randn({rows, 7}, {}, &g);
  Tensor y = (rand({rows}, {}, &g) * 3.0).to(kInt64);
  return {x, y};
}
Batch gpt_batch(int step, int64_t rows) {
  Generator g(200 + uint64_t(step));
  Tensor x = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  Tensor y = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  return {x, y};
}
Batch slice(const Batch& b) {
  int64_t n = b.x.size(0) / dist::world_size();
  return {b.x.narrow(0, n * dist::rank(), n), b.y.narrow(0, n * dist::rank(), n)};
}
Tensor loss_of(nn::Module& m, const Batch& b) {
  Tensor logits = m(b.x);
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), b.y.reshape({-1}));
}
double global_mean(double local) {
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

// Elementwise |got - want| <= atol + rtol * |want| (as torch.testing.assert_close), reporting
// the worst element.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                 const std::string& what, double atol = 1e-6) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::abs(got[i] - want[i]) - rtol * std::abs(want[i]);
    if (excess > worst) worst = excess, at = i;
  }
  INFO(what << ": worst element " << at << " (fsdp " << got[at] << ", reference " << want[at] << ", difference "
            << std::abs(got[at] - want[at]) << ")");
  CHECK(worst <= atol);
}

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
