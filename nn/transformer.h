// nn: transformer building blocks with nanoGPT's layout and parameter names, so checkpoints map one to one: attn.c_attn
// (fused q, k, v: [3d, d]), attn.c_proj, mlp.c_fc, mlp.c_proj, ln_1, ln_2.
#pragma once
#include "documents.h"
#include "kv_cache.h"
#include "layers.h"

namespace weft::nn {

struct TransformerConfig {
  int64_t d_model = 128;
  int64_t n_head = 4;
  double dropout = 0.0;
  bool bias = true;
  std::string gelu_approximate = "tanh";
  int64_t ffn_dim = 0;  // the MLP's hidden width; 0: 4 * d_model
};

// The block machinery every decoder family shares: a pre-norm residual block,
//   h = x + attn(norm_1(x));  out = h + mlp(norm_2(h)),
// whose four children are registered under the family's names.
class PreNormBlock : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  // The same on new positions only (nn/kv_cache.h), with this block's and the attention's
  // forward hooks around it: the attention must be a CachedAttention.
  Tensor forward_cached(const Tensor& x, LayerCache& cache);

 protected:
  PreNormBlock(std::string type, std::pair<std::string, ModulePtr> norm_1, std::pair<std::string, ModulePtr> attn,
               std::pair<std::string, ModulePtr> norm_2, std::pair<std::string, ModulePtr> mlp);

 private:
  ModulePtr norm_1_, attn_, norm_2_, mlp_;
  CachedAttention* cached_attn_;  // attn_ when it can decode with a cache, else null
};

// Causal multi-head self-attention on [B, T, d] with one fused qkv projection.
class CausalSelfAttention : public Module, public CachedAttention, public DocumentAttention {
 public:
  explicit CausalSelfAttention(const TransformerConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  Tensor forward_cached(const Tensor& x, LayerCache& cache) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t d_model, n_head;
  double dropout_p;
  kernels::RandomBlock dropout_block;  // its probabilities' place among a whole model's (tp: this rank's heads)
  std::shared_ptr<Linear> c_attn, c_proj;
};

// Linear(d, ffn) -> GELU -> Linear(ffn, d) -> dropout (ffn = 4d unless the config says).
class MLP : public Module {
 public:
  explicit MLP(const TransformerConfig& cfg, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  std::shared_ptr<Linear> c_fc, c_proj;
  std::string approximate;
  double dropout_p;
};

// GPT-2's pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x)).
class Block : public PreNormBlock {
 public:
  explicit Block(const TransformerConfig& cfg, Generator* gen = nullptr);
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<MLP> mlp;

 private:
  struct Parts {
    std::shared_ptr<LayerNorm> ln_1, ln_2;
    std::shared_ptr<CausalSelfAttention> attn;
    std::shared_ptr<MLP> mlp;
  };
  static Parts make_parts(const TransformerConfig& cfg, Generator* gen);
  explicit Block(Parts p);
};

}  // namespace weft::nn
