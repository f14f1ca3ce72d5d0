#include "tp/llama_plan.h"

#include "core/error.h"
#include "dist/agree.h"
#include "nn/qwen3.h"
#include "tp/parallel_style.h"

namespace weft::tp {

namespace {

ParallelPlan block_plan(const LlamaPlan& plan) {
  const bool sp = plan.sequence_parallel;
  // The attention's and the MLP's input is gathered (or its gradient summed) once for all the colwise layers inside.
  const Style inputs{.input = sp ? Comm::gather_sequence : Comm::copy};
  const Style outputs{Weights::rowwise, Comm::none, sp ? Comm::reduce_scatter : Comm::reduce};
  const Style cols{Weights::colwise};
  ParallelPlan p = {{"model.layers.*.self_attn", inputs}, {"model.layers.*.self_attn.q_proj", cols},
                    {"model.layers.*.self_attn.k_proj", cols}, {"model.layers.*.self_attn.v_proj", cols},
                    {"model.layers.*.self_attn.o_proj", outputs}, {"model.layers.*.mlp", inputs},
                    {"model.layers.*.mlp.gate_proj", cols},      {"model.layers.*.mlp.up_proj", cols},
                    {"model.layers.*.mlp.down_proj", outputs}};
  if (sp)  // the norms run on this rank's block of the sequence
    p.insert(p.end(), {{"model.layers.*.input_layernorm", {.sum_gradients = true}},
                       {"model.layers.*.post_attention_layernorm", {.sum_gradients = true}}});
  return p;
}

// The embedding, the final norm and the head.
ParallelPlan ends_plan(const nn::Llama& model, const LlamaPlan& plan) {
  const bool sp = plan.sequence_parallel, lp = plan.loss_parallel;
  ParallelPlan p;
  if (lp || sp)
    p.emplace_back("model.embed_tokens", Style{lp ? Weights::vocab_rows : Weights::whole, Comm::none,
                                               lp ? (sp ? Comm::reduce_scatter : Comm::reduce) : Comm::scatter});
  // The head's input: whole on every rank; its gradient summed over the vocabulary's columns
  // (loss parallel) or equal everywhere (a whole head).
  const Comm head_input = lp ? (sp ? Comm::gather_sequence : Comm::copy) : (sp ? Comm::gather : Comm::none);
  if (head_input != Comm::none || sp)
    p.emplace_back("model.norm", Style{.output = head_input, .sum_gradients = sp});
  if (lp && model.lm_head) p.emplace_back("lm_head", Style{Weights::colwise});
  return p;
}

}  // namespace

void parallelize_llama(nn::Llama& model, const dist::ProcessGroupPtr& group, const LlamaPlan& plan) {
  WEFT_CHECK(group != nullptr, "tp: parallelize_llama: no process group");
  const int P = group->size();
  const nn::LlamaConfig& c = model.cfg;
  dist::agree({group->device().is_meta() ? nullptr : group}, "tp: parallelize_llama", [&] {  // every rank stops
    WEFT_CHECK(c.n_head % P == 0, "tp: parallelize_llama: n_head {} does not divide over {} ranks", c.n_head, P);
    WEFT_CHECK(c.kv_heads() % P == 0, "tp: parallelize_llama: the {} key/value heads (n_kv_head) do not divide over {} "
               "ranks", c.kv_heads(), P);
    WEFT_CHECK(c.ffn() % P == 0, "tp: parallelize_llama: the MLP's width {} (ffn_dim{}) does not divide over {} ranks",
               c.ffn(), c.ffn_dim > 0 ? "" : ": 8/3 d_model rounded up to 32, as none was given", P);
  });
  ParallelPlan splits = block_plan(plan), ends = ends_plan(model, plan);
  splits.insert(splits.end(), ends.begin(), ends.end());
  if (dynamic_cast<nn::Qwen3Attention*>(model.blocks.front()->self_attn.get()))  // norms of this rank's heads
    splits.insert(splits.end(), {{"model.layers.*.self_attn.q_norm", {.sum_gradients = true}},
                                 {"model.layers.*.self_attn.k_norm", {.sum_gradients = true}}});
  parallelize_module(model, group, splits);
  for (const auto& block : model.blocks) {
    block->self_attn->n_head /= P;
    block->self_attn->n_kv_head /= P;
    block->self_attn->dropout_block = {.dim = 1, .parts = P, .index = group->rank()};  // its probabilities: this rank's heads
  }
}

}  // namespace weft::tp
