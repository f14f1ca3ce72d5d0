// qwen3: Qwen3ForCausalLM, Qwen2's config without the q/k/v biases and with an RMSNorm over each
// head of q and k (nn/qwen3.h); its head_dim (128 in the released models) is read as any Llama's.
#include "apps/transformer/hf_family.h"

namespace weft::apps {

ModelConfig read_qwen3_config(const ConfigReader& r) {
  // the window settings; attention_bias is read (false) as Llama's
  ModelConfig c = read_qwen_config(r, {.n_kv_head = 32, .ctx = 32768, .head_dim = 128});
  c.family = "qwen3";
  c.qkv_bias = false;
  c.qk_norm = true;
  return c;
}

nlohmann::json write_qwen3_config(const ModelConfig& c) {
  nlohmann::json j = write_qwen2_config(c);
  j["attention_bias"] = false;
  return j;
}

}  // namespace weft::apps
