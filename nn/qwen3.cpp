#include "nn/qwen3.h"

namespace weft::nn {

Qwen3Attention::Qwen3Attention(const LlamaConfig& cfg) : LlamaAttention(cfg) {
  q_norm = register_module("q_norm", std::make_shared<RMSNorm>(head_dim, cfg.norm_eps));
  k_norm = register_module("k_norm", std::make_shared<RMSNorm>(head_dim, cfg.norm_eps));
}

std::array<Tensor, 3> Qwen3Attention::heads(const Tensor& x) {
  auto [q, k, v] = LlamaAttention::heads(x);
  // The norms run over each head's channels of the [B, T, H, hd] projections (the heads are
  // their [B, H, T, hd] transposed views).
  return {(*q_norm)(q.transpose(1, 2)).transpose(1, 2), (*k_norm)(k.transpose(1, 2)).transpose(1, 2), v};
}

Qwen3::Qwen3(const LlamaConfig& cfg)
    : Llama(cfg, [](const LlamaConfig& c) { return std::make_shared<LlamaBlock>(c, std::make_shared<Qwen3Attention>(c)); }) {}

}  // namespace weft::nn
