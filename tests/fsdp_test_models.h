// Models, batches and comparisons shared by the multi-rank FSDP suites (inline: the suites are
// linked into one program). Each suite trains a seeded reference model in one process on the
// global batch and the FSDP model on this rank's slice of it, then compares losses and full
// parameters.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "weft.h"

namespace weft::fsdp_test {

// Shapes that do not divide by 2 or 4, so shards are padded (fc2's 3 rows leave rank 3 of 4
// with an empty shard).
struct UnevenMLP : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  UnevenMLP() : nn::Module("UnevenMLP") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(7, 15));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(15, 3));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)(relu((*fc1)(x))); }
  using nn::Module::forward;
};

// Embedding, two pre-LN blocks (1752 parameters each: attn 576 = c_attn 432 + c_proj 144,
// mlp 1152 = 576 + 576, two norms of 12), final norm (24) and head (143). No biases in the
// blocks (the key projection's bias has an exactly-zero
// gradient in theory, so Adam would turn rounding noise into full-size steps that no two
// reduction orders agree on).
struct TinyGPT : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;
  // Other widths, heads and biases for the tensor-parallel suite (its blocks biased everywhere).
  explicit TinyGPT(nn::TransformerConfig cfg = {.d_model = 12, .n_head = 3, .bias = false}, int64_t vocab = 11)
      : nn::Module("TinyGPT") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(vocab, cfg.d_model));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) blocks->push_back(std::make_shared<nn::Block>(cfg));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(cfg.d_model));
    head = register_module("head", std::make_shared<nn::Linear>(cfg.d_model, vocab));
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
inline Batch mlp_batch(int step, int64_t rows = 8) {
  Generator g(100 + uint64_t(step));
  Tensor x = randn({rows, 7}, {}, &g);
  Tensor y = (rand({rows}, {}, &g) * 3.0).to(kInt64);
  return {x, y};
}
inline Batch gpt_batch(int step, int64_t rows = 4) {
  Generator g(200 + uint64_t(step));
  Tensor x = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  Tensor y = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  return {x, y};
}
// Data parallel over every rank, whatever the mesh: each takes its slice of the global batch.
inline Batch slice(const Batch& b) {
  int64_t n = b.x.size(0) / dist::world_size();
  return {b.x.narrow(0, n * dist::rank(), n), b.y.narrow(0, n * dist::rank(), n)};
}
inline Tensor loss_of(nn::Module& m, const Batch& b) {
  Tensor logits = m(b.x);
  return cross_entropy(logits.reshape({-1, logits.size(-1)}), b.y.reshape({-1}));
}
inline double global_mean(double local) {
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

// Elementwise |got - want| <= atol + rtol * |want|, reporting the worst element.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                 const std::string& what, double atol = 1e-6) {
  REQUIRE(got.size() == want.size());
  double worst = -1;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double excess = std::abs(got[i] - want[i]) - rtol * std::abs(want[i]);
    if (excess > worst) worst = excess, at = i;
  }
  INFO(what << ": worst element " << at << " (got " << got[at] << ", reference " << want[at] << ", difference "
            << std::abs(got[at] - want[at]) << ")");
  CHECK(worst <= atol);
}

template <class Model>
std::shared_ptr<Model> seeded(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<Model>();
}

// The parity harness: a seeded reference model trained in one process on the global batches
// and the same model sharded by `shard` trained on this rank's slices, each with AdamW.
// train() runs the steps, comparing the losses (averaged over ranks) with the reference's at
// every step; the hooks run around each FSDP micro-batch (settings, collective counts).
template <class Model>
struct Parity {
  struct Hooks {
    std::function<void(int step, int micro)> before_forward, before_backward, after_backward;
  };
  std::shared_ptr<Model> ref, model;
  fsdp::FSDPModule root;
  nn::AdamW ref_opt, opt;

  template <class Shard>
  explicit Parity(Shard shard, uint64_t seed = 7)
      : ref(seeded<Model>(seed)), model(seeded<Model>(seed)), root(shard(model)),
        ref_opt(ref->parameters(), {.lr = 1e-2}), opt(model->parameters(), {.lr = 1e-2}) {}

  // `steps` optimizer steps of `micro` micro-batches each (the loss scaled by 1/micro).
  template <class MakeBatch>
  void train(MakeBatch make_batch, int64_t rows, int steps, int micro = 1, const Hooks& hooks = {}) {
    for (int step = 0; step < steps; ++step) {
      ref_opt.zero_grad();
      opt.zero_grad();
      double ref_loss = 0, loss = 0;
      for (int m = 0; m < micro; ++m) {
        Batch global = make_batch(step * micro + m, rows);
        Tensor l_ref = loss_of(*ref, global) * (1.0 / micro);
        l_ref.backward();
        ref_loss += l_ref.item();
        if (hooks.before_forward) hooks.before_forward(step, m);
        Tensor l = loss_of(*model, slice(global)) * (1.0 / micro);
        if (hooks.before_backward) hooks.before_backward(step, m);
        l.backward();
        if (hooks.after_backward) hooks.after_backward(step, m);
        loss += l.item();
      }
      ref_opt.step();
      opt.step();
      check_close({global_mean(loss)}, {ref_loss}, 1e-5, fmt::format("loss at step {}", step));
    }
  }
  // Every full parameter of the sharded model against the reference's.
  void check_params(double rtol, const std::string& what) {
    for (auto& [name, p] : ref->named_parameters())
      check_close(to_vector(root.full_tensor(name)), to_vector(p), rtol, what + ": parameter " + name);
  }
};

}  // namespace weft::fsdp_test
