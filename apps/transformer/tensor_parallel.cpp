#include "apps/transformer/tensor_parallel.h"

#include <fmt/format.h>

namespace weft::apps {

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
  const bool llama = cfg.arch == "llama";
  t.sequence_parallel = llama && full_rows && cfg.ctx % tp == 0;
  t.loss_parallel = llama && cfg.vocab_size % tp == 0;
  return t;
}

void parallelize(const LanguageModel& lm, const TensorParallel& tp) {
  if (auto* llama = dynamic_cast<nn::Llama*>(lm.module.get()))
    return tp::parallelize_llama(*llama, tp.group, {.loss_parallel = tp.loss_parallel,
                                                    .sequence_parallel = tp.sequence_parallel});
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
