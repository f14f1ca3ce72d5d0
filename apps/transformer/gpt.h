// apps/transformer: a GPT decoder over bytes, laid out and named as nanoGPT's model
// (transformer.wte, transformer.wpe, transformer.h.{i}, transformer.ln_f, lm_head), so the
// state dict keys match a nanoGPT checkpoint converted to safetensors.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "apps/transformer/model.h"
#include "weft.h"

namespace weft::apps {

// Input: token ids [B, T] (i64, T <= ctx). Output: logits [B, T, vocab_size]. When the head is tied there is no lm_head
// module: the logits use transformer.wte.weight directly, so the weight is one parameter (one FSDP shard, one optimizer
// state) and the state dict has no separate lm_head.weight.
class GPT : public nn::Module, public nn::CausalLM {
 public:
  explicit GPT(const ModelConfig& cfg);
  Tensor forward(const Tensor& idx) override;
  // Packed rows (nn/documents.h): ids and their positions, each document from position 0.
  nn::TensorList forward(const nn::TensorList& ids_positions) override;
  std::string extra_repr() const override;
  nn::KVCache make_cache() const override { return nn::KVCache(cfg.n_layer, cfg.ctx); }
  int64_t context_length() const override { return cfg.ctx; }
  int64_t vocab_size() const override { return cfg.vocab_size; }

  ModelConfig cfg;
  nn::ModulePtr transformer;  // container of wte, wpe, h, ln_f (nanoGPT's ModuleDict)
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied
  std::vector<std::shared_ptr<nn::Block>> blocks;

 protected:
  Tensor hidden_cached(const Tensor& idx, nn::KVCache& cache) override;
  Tensor logits(const Tensor& x) override;  // ln_f and the head

 private:
  Tensor embed(const Tensor& idx, int64_t pos0);  // tokens at positions pos0.. plus their positions
  Tensor embed(const Tensor& idx, const Tensor& pos);
};

// nanoGPT's initialisation from the default generator: N(0, 0.02) for Linear and Embedding
// weights, N(0, 0.02/sqrt(2 n_layer)) for the residual projections (attn.c_proj, mlp.c_proj),
// zero biases, LayerNorm (1, 0). Deterministic in the parameter order.
void init_gpt(GPT& model);

}  // namespace weft::apps
