// apps/transformer: the decoder families weft-transformer trains, behind one config and one handle: GPT-2 (apps::GPT:
// learned positions, LayerNorm, GELU, tied head; nanoGPT's and Hugging Face GPT2LMHeadModel's names) and Llama
// (nn::Llama: RoPE, RMSNorm, SwiGLU, grouped-query attention, untied head; LlamaForCausalLM's names).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "weft.h"

namespace weft::apps {

struct ModelConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t ctx = 128;         // the longest sequence (GPT-2: the position table's size)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 128;
  bool tie_weights = true;   // the head shares the token embedding
  double dropout = 0.0;
  std::string arch = "gpt2";  // "gpt2" or "llama"
  int64_t n_kv_head = 0;      // llama: key/value heads dividing n_head (0: n_head)
  int64_t ffn_dim = 0;        // the MLP's hidden width (0: gpt2 4 d_model, llama 8/3 d_model rounded up to 32)
  int64_t head_dim = 0;       // llama: channels per head (0: d_model / n_head)
  double rope_theta = 10000;  // llama
  double norm_eps = 1e-5;     // llama's RMSNorm (GPT-2's LayerNorm eps is 1e-5)
  kernels::RopeScaling rope_scaling;  // llama: Hugging Face's rope_scaling (none unless a config.json sets it)
  bool qkv_bias = false;       // llama: biases on q, k and v (Qwen2)
  bool qk_norm = false;        // llama: an RMSNorm over each head of q and k (Qwen3: nn/qwen3.h)
  int64_t sliding_window = 0;  // llama: a config.json's attention window (Mistral; 0: none); ctx must be within it
  std::string family;          // the Hugging Face model_type read ("": the arch's own), which export-hf writes
};

// Upper bounds of the config's fields (the flags' ranges, and what a checkpoint may declare).
constexpr int64_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxDModel = 65536, kMaxCtx = 1 << 20,
                  kMaxVocab = 1 << 24, kMaxSampleTokens = 1 << 20;

// The parameter count of a model with this config (as a double: no overflow for absurd configs).
double param_count(const ModelConfig& cfg);

// Checks a config and throws a weft::Error naming the flag at fault. check_fits_host: a model whose float32 weights
// alone would not fit in this machine's memory, before one process allocates it whole (train's validate without
// --fsdp or with --tp, a whole load); a sharded or planned model is the memory plan's to check (docs/FSDP.md).
void check_config(const ModelConfig& cfg);
void check_fits_host(const ModelConfig& cfg);
// A --ctx past `name`'s context is refused, naming its sliding_window where that is what bounds it.
inline void check_ctx_within(int64_t ctx, const ModelConfig& cfg, const std::string& name) {
  WEFT_CHECK(ctx <= cfg.ctx, "transformer: --ctx {} is longer than {}'s context {}{}", ctx, name, cfg.ctx,
             cfg.sliding_window == cfg.ctx ? " (its sliding_window: weft attends to the whole context)" : "");
}

nn::LlamaConfig llama_config(const ModelConfig& cfg);

// A model of either family: the module, its blocks (one FSDP group and one activation checkpoint each) and its config.
struct LanguageModel {
  ModelConfig cfg;
  std::shared_ptr<nn::Module> module;
  std::vector<nn::ModulePtr> blocks;
};
// Built on the default device (meta under a DefaultDeviceGuard for deferred init).
LanguageModel make_model(const ModelConfig& cfg);
// The family's initialisation (apps::init_gpt, nn::init_llama) from the default generator.
void init_model(const LanguageModel& model);
// A model whose every parameter is loaded next, whole (a Hugging Face directory, a checkpoint):
// built on the meta device with FillRule::Kind::none, so that materialising or sharding it
// only allocates (no values written before the load writes them) and draws no random numbers.
LanguageModel make_model_to_load(const ModelConfig& cfg);

// The token embedding's parameter name, which a tied head shares, and the name a head has when
// it is not tied (consolidated files and Hugging Face files list a tied head under it).
std::string embedding_name(const ModelConfig& cfg);
constexpr const char* kHeadName = "lm_head.weight";

}  // namespace weft::apps
