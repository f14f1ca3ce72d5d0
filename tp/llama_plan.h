// tp: Megatron's split of the Llama decoder (nn/llama.h) and of the families built on it (Qwen2's q/k/v biases, Qwen3's
// per-head norms, Mistral) over a tensor-parallel group of P ranks. In every block q_proj, k_proj, v_proj, gate_proj
// and up_proj are colwise and o_proj and down_proj rowwise (tp/parallel_style.h): each rank computes n_head / P query
// heads, n_kv_head / P key/value heads (grouping kept: rank r's query heads read rank r's key/value heads) and ffn / P
// of SwiGLU's width, with one all-reduce after the attention and one after the MLP in forward, and one each before them
// in backward.
//
// The embedding, the norms and the head stay whole on every rank (unless loss_parallel): their inputs and the gradients
// reaching them are equal on every rank, so are their gradients. Qwen3's head norms apply to this rank's heads: their
// gradients are summed over the group (sum_gradients). Attention dropout draws, for this rank's heads, the masks of the
// whole probabilities (each attention's dropout_block): a run with dropout is the 1-rank run's.
#pragma once
#include "../dist/process_group.h"
#include "../nn/llama.h"

namespace weft::tp {

struct LlamaPlan {
  // Loss parallel: the embedding split by vocabulary rows, the head too (colwise by vocabulary, or tied to the split
  // embedding); the model's logits are then this rank's vocabulary columns, for tp::vocab_parallel_cross_entropy.
  bool loss_parallel = false;
  // Sequence parallel: between the blocks' attention and MLP, the residual stream and the norms
  // hold this rank's block of the sequence (1/P of the activations there): the attention's and
  // the MLP's input is all-gathered, their output reduce-scattered, in place of one all-reduce;
  // the norms' gradients are summed over the group. The sequence must divide by P.
  bool sequence_parallel = false;
};

// Throws, before anything is split, when n_head, the key/value heads, the SwiGLU width (or the
// vocabulary, loss parallel) do not divide over the group, or a layer is not the plan's kind.
void parallelize_llama(nn::Llama& model, const dist::ProcessGroupPtr& group, const LlamaPlan& plan = {});

}  // namespace weft::tp
