// nn: transformer building blocks with nanoGPT's layout and parameter names, so checkpoints
// map one to one: attn.c_attn (fused q, k, v: [3d, d]), attn.c_proj, mlp.c_fc, mlp.c_proj,
// ln_1, ln_2.
#pragma once
#include "nn/layers.h"

namespace weft::nn {

struct TransformerConfig {
  int64_t d_model = 128;
  int64_t n_head = 4;
  double dropout = 0.0;
  bool bias = true;
  std::string gelu_approximate = "tanh";
};

// Causal multi-head self-attention on [B, T, d] with one fused qkv projection.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const TransformerConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t d_model, n_head;
  double dropout_p;
  std::shared_ptr<Linear> c_attn, c_proj;
};

// Linear(d, 4d) -> GELU -> Linear(4d, d) -> dropout.
class MLP : public Module {
 public:
  explicit MLP(const TransformerConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::string approximate;
  double dropout_p;
};

// Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public Module {
 public:
  explicit Block(const TransformerConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;
};

}  // namespace weft::nn
