#include "tp/llama_plan.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/qwen3.h"
#include "tp/collectives.h"
#include "tp/parallel_style.h"

namespace weft::tp {

using nn::TensorList;
namespace {

// A module every rank holds whole but applies to its own part of a split activation (Qwen3's
// head norms): while it runs, its parameters pass copy_to_parallel, so their gradients, partial
// sums on each rank, are all-reduced on their way into whatever tensors the slots hold (fsdp's
// unsharded parameters under fully_shard; the recompute under activation checkpointing runs
// these hooks again).
void sum_gradients_over(nn::Module& m, const dist::ProcessGroupPtr& group) {
  auto held = std::make_shared<std::vector<std::pair<std::string, Tensor>>>();
  auto restore = [held](nn::Module& mod) {
    for (auto& [name, p] : *held) mod.parameter_slot(name) = p;
    held->clear();
  };
  m.register_forward_pre_hook([group, held, restore](nn::Module& mod, const TensorList&) -> std::optional<TensorList> {
    restore(mod);  // after a forward that threw
    for (auto& [name, p] : mod.named_parameters(false)) {
      held->emplace_back(name, p);
      mod.parameter_slot(name) = copy_to_parallel(p, group);
    }
    return std::nullopt;
  });
  m.register_forward_hook([restore](nn::Module& mod, const TensorList&, const TensorList&) -> std::optional<TensorList> {
    restore(mod);
    return std::nullopt;
  });
}

}  // namespace

void parallelize_llama(nn::Llama& model, const dist::ProcessGroupPtr& group, const LlamaPlan& plan) {
  WEFT_CHECK(group != nullptr, "tp: parallelize_llama: no process group");
  const int P = group->size();
  const nn::LlamaConfig& c = model.cfg;
  WEFT_CHECK(c.n_head % P == 0, "tp: parallelize_llama: n_head {} does not divide over {} ranks", c.n_head, P);
  WEFT_CHECK(c.kv_heads() % P == 0, "tp: parallelize_llama: the {} key/value heads (n_kv_head) do not divide over {} ranks",
             c.kv_heads(), P);
  ParallelPlan splits = {{"model.layers.*.self_attn", Split::shared_input},
                         {"model.layers.*.self_attn.q_proj", Split::colwise_shared},
                         {"model.layers.*.self_attn.k_proj", Split::colwise_shared},
                         {"model.layers.*.self_attn.v_proj", Split::colwise_shared},
                         {"model.layers.*.self_attn.o_proj", Split::rowwise},
                         {"model.layers.*.mlp", Split::shared_input},
                         {"model.layers.*.mlp.gate_proj", Split::colwise_shared},
                         {"model.layers.*.mlp.up_proj", Split::colwise_shared},
                         {"model.layers.*.mlp.down_proj", Split::rowwise}};
  if (plan.loss_parallel) {
    splits.insert(splits.end(), {{"model.embed_tokens", Split::vocab_rows}, {"model.norm", Split::shared_output}});
    if (model.lm_head) splits.emplace_back("lm_head", Split::colwise_shared);
  }
  parallelize_module(model, group, splits);
  for (const auto& block : model.blocks) {
    nn::LlamaAttention& a = *block->self_attn;
    a.n_head /= P;
    a.n_kv_head /= P;
    if (auto* q3 = dynamic_cast<nn::Qwen3Attention*>(&a))
      for (const auto& norm : {q3->q_norm, q3->k_norm}) sum_gradients_over(*norm, group);
  }
}

}  // namespace weft::tp
