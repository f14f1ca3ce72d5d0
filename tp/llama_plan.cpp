#include "tp/llama_plan.h"

#include "core/error.h"
#include "nn/qwen3.h"
#include "tp/collectives.h"
#include "tp/parallel_style.h"

namespace weft::tp {
namespace {

// A parameter every rank holds whole but applies to its own part of a split activation: its
// gradient on each rank is a partial sum, all-reduced before it is accumulated.
void sum_gradient_over(const Tensor& param, const dist::ProcessGroupPtr& group) {
  param.register_hook([group](const Tensor& grad) { return reduce_from_parallel(grad, group); });
}

}  // namespace

void parallelize_llama(nn::Llama& model, const dist::ProcessGroupPtr& group) {
  WEFT_CHECK(group != nullptr, "tp: parallelize_llama: no process group");
  const int P = group->size();
  const nn::LlamaConfig& c = model.cfg;
  WEFT_CHECK(c.n_head % P == 0, "tp: parallelize_llama: n_head {} does not divide over {} ranks", c.n_head, P);
  WEFT_CHECK(c.kv_heads() % P == 0, "tp: parallelize_llama: the {} key/value heads (n_kv_head) do not divide over {} ranks",
             c.kv_heads(), P);
  parallelize_module(model, group, {{"model.layers.*.self_attn.q_proj", colwise_parallel()},
                                    {"model.layers.*.self_attn.k_proj", colwise_parallel()},
                                    {"model.layers.*.self_attn.v_proj", colwise_parallel()},
                                    {"model.layers.*.self_attn.o_proj", rowwise_parallel()},
                                    {"model.layers.*.mlp.gate_proj", colwise_parallel()},
                                    {"model.layers.*.mlp.up_proj", colwise_parallel()},
                                    {"model.layers.*.mlp.down_proj", rowwise_parallel()}});
  for (const auto& block : model.blocks) {
    nn::LlamaAttention& a = *block->self_attn;
    a.n_head /= P;
    a.n_kv_head /= P;
    if (auto* q3 = dynamic_cast<nn::Qwen3Attention*>(&a))
      for (const auto& norm : {q3->q_norm, q3->k_norm}) sum_gradient_over(norm->weight, group);
  }
}

}  // namespace weft::tp
