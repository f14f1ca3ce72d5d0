// tp: Megatron's split of GPT-2's blocks (nn::Block of nn/transformer.h, wherever they sit in a model) over a
// tensor-parallel group of P ranks: attn.c_attn colwise in three blocks (each rank keeps n_head / P heads of q, of k
// and of v, with their biases), attn.c_proj rowwise; mlp.c_fc colwise, mlp.c_proj rowwise; the attention's and the
// MLP's input passed through copy_to_parallel once. The rowwise projections' biases are added once (by rank 0's partial
// output) and their gradients summed. The embeddings, the norms and the tied head stay whole: GPT-2's 50,257-token
// vocabulary divides by no P > 1. A block's attention then reads n_head / P heads (their dropout draws the whole's
// masks for them); the KV-cache path is not split.
#pragma once
#include "../dist/process_group.h"
#include "../nn/module.h"

namespace weft::tp {

// Throws, before anything is split, when `root` holds no nn::Block, or the heads or the MLP's
// width do not divide over the group.
void parallelize_gpt2_blocks(nn::Module& root, const dist::ProcessGroupPtr& group);

}  // namespace weft::tp
