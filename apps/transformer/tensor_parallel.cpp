#include "apps/transformer/tensor_parallel.h"

#include <fmt/format.h>

#include "dist/fake_group.h"

namespace weft::apps {

namespace {

void choose_plan(TensorParallel& t, const ModelConfig& cfg, bool full_rows) {
  const bool llama = cfg.arch == "llama";
  t.sequence_parallel = llama && full_rows && cfg.ctx % t.size == 0;
  t.loss_parallel = llama && cfg.vocab_size % t.size == 0;
}

}  // namespace

TensorParallel planned_tensor_parallel(const ModelConfig& cfg, int tp, bool full_rows) {
  TensorParallel t{.size = tp, .group = dist::fake_group(0, tp, "tp")};
  choose_plan(t, cfg, full_rows);
  return t;
}

TensorParallel make_tensor_parallel(const ModelConfig& cfg, int tp, bool full_rows) {
  const int dp = dist::world_size() / tp;
  WEFT_CHECK(dp * tp == dist::world_size(), "transformer: --tp {} does not divide the {} ranks", tp, dist::world_size());
  TensorParallel t{.size = tp};
  t.mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{dp, tp},
                                              std::vector<std::string>{"dp", "tp"});
  t.over_dp = std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{dp}, std::vector<std::string>{"dp"},
                                                 std::vector<int>{t.mesh->coordinate(0)},
                                                 std::vector<dist::ProcessGroupPtr>{t.mesh->group("dp")});
  t.group = t.mesh->group("tp");
  choose_plan(t, cfg, full_rows);
  return t;
}

void parallelize(const LanguageModel& lm, const TensorParallel& tp) {
  if (auto* llama = dynamic_cast<nn::Llama*>(lm.module.get()))
    return tp::parallelize_llama(*llama, tp.group, {.loss_parallel = tp.loss_parallel,
                                                    .sequence_parallel = tp.sequence_parallel});
  WEFT_CHECK(!tp.sequence_parallel && !tp.loss_parallel, "transformer: sequence and loss parallel are Llama's (GPT-2's "
             "embedding and head stay whole on every rank of its tensor-parallel group)");
  tp::parallelize_gpt2_blocks(*lm.module, tp.group);
}

LossFn tensor_parallel_loss(const TensorParallel& tp) {
  if (!tp.loss_parallel) return {};
  return [group = tp.group](const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& opts) {
    return tp::vocab_parallel_cross_entropy(logits, targets, group, opts);
  };
}

std::string describe(const TensorParallel& tp) {
  return fmt::format("tensor parallel: {} ranks per group x {} data-parallel group(s){}{}", tp.size,
                     tp.mesh->size(0), tp.sequence_parallel ? ", sequence parallel" : "",
                     tp.loss_parallel ? ", loss parallel" : "");
}

}  // namespace weft::apps
