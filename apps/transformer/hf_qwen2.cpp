// qwen2: Qwen2ForCausalLM (Qwen2, Qwen2.5), Llama's layers and names with biases on q_proj,
// k_proj and v_proj (not o_proj). Its sliding-window attention is refused when on.
#include "apps/transformer/hf_family.h"

namespace weft::apps {

ModelConfig read_qwen2_config(const ConfigReader& r) { return read_qwen_config(r, {.n_kv_head = 32, .ctx = 32768}); }

ModelConfig read_qwen_config(const ConfigReader& r, const LlamaDefaults& defaults) {
  ModelConfig c = read_llama_shaped(r, defaults);
  c.family = "qwen2";
  c.qkv_bias = true;
  r.require("use_sliding_window", r.boolean("use_sliding_window", false), false, "full attention in every layer");
  if (const nlohmann::json* types = r.find("layer_types")) {
    for (const nlohmann::json& t : *types)
      if (t != "full_attention") r.fail("layer_types", fmt::format("holds {}: weft computes full attention only", t.dump()));
  }
  return c;
}

nlohmann::json write_qwen2_config(const ModelConfig& c) {
  nlohmann::json j = write_llama_config(c);
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(llama_only);
  j["use_sliding_window"] = false;
  return j;
}

}  // namespace weft::apps
