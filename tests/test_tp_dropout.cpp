// Dropout under tensor parallelism (tp/): a split activation's dropout draws, for each of its
// elements, what that element of the whole activation draws in one process (the attention
// probabilities split by heads, a rowwise layer's LoRA input split by columns), and a whole one
// the same mask on every rank. A Llama (with and without sequence and loss parallel) and GPT-2's
// blocks with dropout, each also with LoRA dropout on colwise and rowwise targets, split over
// every rank, give the one-process model's losses and gradients from the same generator state,
// and leave the generator where the one-process run leaves it.
#include <catch2/catch.hpp>

#include "tp_test_models.h"

using namespace weft;
using namespace weft::tp_test;
using fsdp_test::check_close;

namespace {

// The part of `whole` that `split`, a parameter tp split, holds (tp::split_of says where); all
// of it for a parameter held whole.
Tensor part_of(const Tensor& whole, const Tensor& split) {
  const tp::Split s = tp::split_of(partial_reduction(split));
  if (!s.split()) return whole;
  const int64_t block = whole.size(s.dim) / s.chunks, n = block / s.parts;
  std::vector<Tensor> parts;
  for (int64_t c = 0; c < s.chunks; ++c) parts.push_back(whole.narrow(s.dim, c * block + s.index * n, n));
  return cat(parts, s.dim);
}

// `steps` AdamW steps of the one-process model and of the split one, each forward and backward
// from the same generator state: at every step the same loss, every gradient the part of the
// whole one's, and the generator left at the same counter.
void train_alike(nn::Module& whole, nn::Module& split, int steps, bool loss_parallel) {
  nn::AdamW whole_opt(whole.parameters(), {.lr = 1e-2}), split_opt(split.parameters(), {.lr = 1e-2});
  for (int step = 0; step < steps; ++step) {
    const std::string at = " at step " + std::to_string(step);
    const fsdp_test::Batch b = token_batch(step);
    whole_opt.zero_grad();
    split_opt.zero_grad();
    const Generator::State start = default_generator().state();
    Tensor lw = fsdp_test::loss_of(whole, b);
    lw.backward();
    const uint64_t whole_end = default_generator().offset();
    default_generator().set_state(start);
    Tensor ls = loss_parallel ? parallel_loss_of(split, b) : fsdp_test::loss_of(split, b);
    ls.backward();
    CHECK(default_generator().offset() == whole_end);
    check_close({ls.item()}, {lw.item()}, 1e-5, "loss" + at);
    auto s = split.named_parameters(), w = whole.named_parameters();
    REQUIRE(s.size() == w.size());
    for (size_t i = 0; i < s.size(); ++i)
      if (s[i].second.grad().defined())  // a LoRA model's frozen base has none
        check_close(values(s[i].second.grad()), values(part_of(w[i].second.grad(), s[i].second)), 1e-5,
                    "gradient of " + s[i].first + at);
    whole_opt.step();
    split_opt.step();
  }
}

// Adapters with dropout on `targets`, B moved off zero (so that A's gradient is not zero).
void adapt(nn::Module& m, const std::vector<std::string>& targets) {
  manual_seed(5);
  nn::apply_lora(m, {.rank = 4, .alpha = 8, .dropout = 0.25, .targets = targets});
  NoGradGuard no_grad;
  for (auto& [name, p] : m.named_parameters())
    if (name.ends_with("lora_B.weight")) nn::init::normal_(p, 0, 0.1);
}

}  // namespace

TEST_CASE("Llama with dropout split over the ranks draws the one-process model's masks") {
  nn::LlamaConfig cfg = small_llama();
  cfg.dropout = 0.25;  // on the attention probabilities: each rank's heads
  auto make = [&](bool lora) {
    auto m = seeded_llama<nn::Llama>(cfg, 41);
    if (lora) adapt(*m, {"q_proj", "o_proj", "up_proj", "down_proj"});  // colwise and rowwise
    return m;
  };
  for (const bool lora : {false, true})
    for (const tp::LlamaPlan plan : {tp::LlamaPlan{}, tp::LlamaPlan{.sequence_parallel = true},
                                     tp::LlamaPlan{.loss_parallel = true, .sequence_parallel = true}}) {
      INFO("LoRA " << lora << ", sequence parallel " << plan.sequence_parallel << ", loss parallel " << plan.loss_parallel);
      auto whole = make(lora), split = make(lora);
      tp::parallelize_llama(*split, group(), plan);
      train_alike(*whole, *split, 3, plan.loss_parallel);
    }
}

TEST_CASE("GPT-2's blocks with dropout split over the ranks draw the one-process model's masks") {
  // Dropout on the attention probabilities (each rank's heads) and on the attention's and the
  // MLP's outputs (whole on every rank, after the rowwise all-reduce).
  auto make = [](bool lora) {
    manual_seed(42);
    auto m = std::make_shared<fsdp_test::TinyGPT>(
        nn::TransformerConfig{.d_model = 16, .n_head = 4, .dropout = 0.25, .bias = false}, 32);
    if (lora) adapt(*m, {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"});  // q | k | v in three blocks; rowwise
    return m;
  };
  for (const bool lora : {false, true}) {
    INFO("LoRA " << lora);
    auto whole = make(lora), split = make(lora);
    tp::parallelize_gpt2_blocks(*split, group());
    train_alike(*whole, *split, 3, false);
  }
}
