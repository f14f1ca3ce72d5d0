// apps/transformer: a GPT decoder over bytes, laid out and named as nanoGPT's model
// (transformer.wte, transformer.wpe, transformer.h.{i}, transformer.ln_f, lm_head), so the
// state dict keys match a nanoGPT checkpoint converted to safetensors.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "weft.h"

namespace weft::apps {

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t ctx = 128;         // block size: the longest sequence the position table covers
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 128;
  bool tie_weights = true;   // lm_head shares transformer.wte.weight
  double dropout = 0.0;
};

// Upper bounds of the config's fields (the flags' ranges, and what a checkpoint may declare).
constexpr int64_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxDModel = 65536, kMaxCtx = 1 << 20,
                  kMaxVocab = 1 << 24, kMaxSampleTokens = 1 << 20;

// The parameter count of a GPT with this config (as a double: no overflow for absurd configs).
double param_count(const GPTConfig& cfg);

// Checks a config and throws a weft::Error naming the flag at fault, including a model whose
// float32 weights alone would not fit in this machine's memory (before anything is allocated).
void check_config(const GPTConfig& cfg);

// Input: token ids [B, T] (i64, T <= ctx). Output: logits [B, T, vocab_size].
// When the head is tied there is no lm_head module: the logits use transformer.wte.weight
// directly, so the weight is one parameter (one FSDP shard, one optimizer state) and the
// state dict has no separate lm_head.weight.
class GPT : public nn::Module {
 public:
  explicit GPT(const GPTConfig& cfg);
  Tensor forward(const Tensor& idx) override;
  using nn::Module::forward;
  std::string extra_repr() const override;

  GPTConfig cfg;
  nn::ModulePtr transformer;  // container of wte, wpe, h, ln_f (nanoGPT's ModuleDict)
  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::ModuleList> h;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> lm_head;  // null when tied
  std::vector<std::shared_ptr<nn::Block>> blocks;
};

// nanoGPT's initialisation from the default generator: N(0, 0.02) for Linear and Embedding
// weights, N(0, 0.02/sqrt(2 n_layer)) for the residual projections (attn.c_proj, mlp.c_proj),
// zero biases, LayerNorm (1, 0). Deterministic in the parameter order.
void init_gpt(GPT& model);

int64_t count_parameters(const nn::Module& model);

}  // namespace weft::apps
