// Models, batches and comparisons shared by the multi-rank FSDP suites. Each suite trains a
// seeded reference model in one process on the global batch and the FSDP model on this rank's
// slice of it, then compares losses and full parameters.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "dist/dist.h"
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
Batch mlp_batch(int step, int64_t rows = 8) {
  Generator g(100 + uint64_t(step));
  Tensor x = randn({rows, 7}, {}, &g);
  Tensor y = (rand({rows}, {}, &g) * 3.0).to(kInt64);
  return {x, y};
}
Batch gpt_batch(int step, int64_t rows = 4) {
  Generator g(200 + uint64_t(step));
  Tensor x = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  Tensor y = (rand({rows, 5}, {}, &g) * 11.0).to(kInt64);
  return {x, y};
}
// Data parallel over every rank, whatever the mesh: each takes its slice of the global batch.
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

// Elementwise |got - want| <= atol + rtol * |want|, reporting the worst element.
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


}  // namespace weft::fsdp_test
