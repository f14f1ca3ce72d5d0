// nn: Qwen3's decoder (Hugging Face's Qwen3ForCausalLM): Llama's blocks, names and rotary embeddings with an RMSNorm
// over each head of q and of k (self_attn.q_norm, self_attn.k_norm, [head_dim] weights), applied after the projections
// and before the rotation; head_dim is explicit in its configs (128, not hidden / heads).
#pragma once
#include "llama.h"

namespace weft::nn {

class Qwen3Attention : public LlamaAttention {
 public:
  explicit Qwen3Attention(const LlamaConfig& cfg);
  std::shared_ptr<RMSNorm> q_norm, k_norm;

 protected:
  std::array<Tensor, 3> heads(const Tensor& x) override;
};

// A Llama whose blocks attend with Qwen3Attention; init_llama initialises it (the head norms 1).
class Qwen3 : public Llama {
 public:
  explicit Qwen3(const LlamaConfig& cfg);
};

}  // namespace weft::nn
