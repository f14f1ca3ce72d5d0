// apps/transformer: --tp N. The world is a (dp, tp) mesh, tp innermost: N consecutive ranks form a tensor-parallel
// group and train on the same rows of each batch; the world / N groups are data parallel. The model is built whole on
// every rank (the same seed: the 1-rank run's values), split over its tp group by its family's plan (tp/llama_plan.h,
// tp/gpt2_plan.h), and then fully_shard over the data-parallel ranks. Llama and the families on it run sequence
// parallel when every row holds ctx tokens and ctx divides by N, and loss parallel (embedding and head split by
// vocabulary, the loss over the split logits) when the vocabulary divides by N; GPT-2 splits its blocks (its embeddings
// and tied head stay whole).
#pragma once
#include <memory>
#include <string>

#include "apps/common/trainer.h"
#include "apps/transformer/model.h"

namespace weft::apps {

struct TensorParallel {
  int size = 1;  // N: ranks per tensor-parallel group
  std::shared_ptr<dist::DeviceMesh> mesh;     // (dp, tp)
  std::shared_ptr<dist::DeviceMesh> over_dp;  // this rank's data-parallel ranks (1-D), for fully_shard
  dist::ProcessGroupPtr group;                // this rank's tp group
  bool sequence_parallel = false, loss_parallel = false;
};

// The layout of `tp` ranks per group for a model of `cfg` whose rows are ctx tokens long (`full_rows`; else they vary,
// and sequence parallel is off). A collective call on every rank; the world must divide by `tp`.
TensorParallel make_tensor_parallel(const ModelConfig& cfg, int tp, bool full_rows);

// Splits `lm` (materialised, equal on every rank of the group) by its family's plan; throws
// before changing anything when its heads or widths do not divide by the group's size.
void parallelize(const LanguageModel& lm, const TensorParallel& tp);

// The layout a memory plan splits a meta model by: rank 0 of a fake tp group (dist/fake_group.h),
// sequence and loss parallel chosen as make_tensor_parallel chooses them; no mesh.
TensorParallel planned_tensor_parallel(const ModelConfig& cfg, int tp, bool full_rows);

// The loss of the model's logits: over the vocabulary's split under loss parallel, else null
// (weft::cross_entropy of whole logits).
LossFn tensor_parallel_loss(const TensorParallel& tp);

// "tensor parallel: 2 ranks per group x 2 data-parallel groups, sequence parallel, loss parallel".
std::string describe(const TensorParallel& tp);

}  // namespace weft::apps
