// nn: the Llama family of decoders (RMSNorm, rotary position embeddings, SwiGLU MLP,
// grouped-query attention, no biases, an untied head by default), with Hugging Face's
// LlamaForCausalLM layout and parameter names, so its checkpoints map one to one:
//   model.embed_tokens, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
//   post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head.
// The blocks are nn/transformer.h's PreNormBlock, as GPT-2's are.
#pragma once
#include <array>
#include <functional>

#include "containers.h"
#include "documents.h"
#include "layers.h"
#include "transformer.h"

namespace weft::nn {

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t ctx = 128;        // the longest sequence it is trained or evaluated on
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 0;    // key/value heads, dividing n_head; 0: n_head (no grouping)
  int64_t d_model = 128;
  int64_t head_dim = 0;     // 0: d_model / n_head
  int64_t ffn_dim = 0;      // SwiGLU's hidden width; 0: 8/3 d_model rounded up to a multiple of 32
  double rope_theta = 10000.0;
  kernels::RopeScaling rope_scaling;  // Hugging Face's rope_scaling (kernels/rope.h): none by default
  double norm_eps = 1e-5;
  double dropout = 0.0;     // on the attention probabilities while training
  bool tie_weights = false; // lm_head shares model.embed_tokens.weight
  bool qkv_bias = false;    // q_proj, k_proj and v_proj with biases (Qwen2)

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : d_model / n_head; }
  int64_t ffn() const { return ffn_dim > 0 ? ffn_dim : (8 * d_model / 3 + 31) / 32 * 32; }
};

// Throws naming the field at fault (before anything is allocated).
void check_llama_config(const LlamaConfig& cfg);

// Causal self-attention with separate bias-free q, k, v, o projections, n_kv_head key/value
// heads and rotary embeddings applied inside the fused attention (no rotated or repeated copies).
class LlamaAttention : public Module, public CachedAttention, public DocumentAttention {
 public:
  explicit LlamaAttention(const LlamaConfig& cfg);
  Tensor forward(const Tensor& x) override;
  Tensor forward_cached(const Tensor& x, LayerCache& cache) override;
  using Module::forward;
  std::string extra_repr() const override;
  int64_t n_head, n_kv_head, head_dim;
  double rope_theta, dropout_p;
  kernels::RandomBlock dropout_block;  // its probabilities' place among a whole model's (tp: this rank's heads)
  kernels::RopeScaling rope_scaling;
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;

 protected:
  virtual std::array<Tensor, 3> heads(const Tensor& x);  // q, k, v as [B, H, T, hd] views
};

// down_proj(silu(gate_proj(x)) * up_proj(x)), the element-wise part fused (swiglu).
class SwiGLU : public Module {
 public:
  SwiGLU(int64_t d_model, int64_t ffn_dim);
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

class LlamaBlock : public PreNormBlock {
 public:
  // `attention` in place of a LlamaAttention of cfg (a family's own, as nn/qwen3.h's).
  explicit LlamaBlock(const LlamaConfig& cfg, std::shared_ptr<LlamaAttention> attention = nullptr);
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<SwiGLU> mlp;

 private:
  struct Parts {
    std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
    std::shared_ptr<LlamaAttention> self_attn;
    std::shared_ptr<SwiGLU> mlp;
  };
  static Parts make_parts(const LlamaConfig& cfg, std::shared_ptr<LlamaAttention> attention);
  explicit LlamaBlock(Parts p);
};

// Token ids [B, T] (i64, T <= ctx) -> logits [B, T, vocab_size]; forward_cached decodes with a
// key/value cache (nn/kv_cache.h). forward({ids, positions}) runs packed rows (nn/documents.h):
// each document rotated from position 0 and attending within itself.
class Llama : public Module, public CausalLM {
 public:
  // `make_block` builds each block (a family with its own attention passes its own; default LlamaBlock(cfg)).
  using BlockMaker = std::function<std::shared_ptr<LlamaBlock>(const LlamaConfig&)>;
  explicit Llama(const LlamaConfig& cfg, const BlockMaker& make_block = nullptr);
  Tensor forward(const Tensor& idx) override;
  TensorList forward(const TensorList& ids_positions) override;
  std::string extra_repr() const override;
  KVCache make_cache() const override { return KVCache(cfg.n_layer, cfg.ctx); }
  int64_t context_length() const override { return cfg.ctx; }
  int64_t vocab_size() const override { return cfg.vocab_size; }

  LlamaConfig cfg;
  ModulePtr model;  // container of embed_tokens, layers, norm
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<ModuleList> layers;
  std::shared_ptr<RMSNorm> norm;
  std::shared_ptr<Linear> lm_head;  // null when tied
  std::vector<std::shared_ptr<LlamaBlock>> blocks;

 protected:
  Tensor hidden_cached(const Tensor& idx, KVCache& cache) override;
  Tensor logits(const Tensor& x) override;  // the final norm and the head
};

// Hugging Face's initialisation (initializer_range 0.02): N(0, 0.02) for every Linear and Embedding weight, except
// o_proj and down_proj, the residual projections, at N(0, 0.02 / sqrt(2 n_layer)) as GPT-2's; RMSNorm weights 1, biases
// 0. From the default generator, in parameter order.
void init_llama(Llama& model);

}  // namespace weft::nn
