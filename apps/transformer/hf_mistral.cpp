// mistral: MistralForCausalLM, Llama's layers and names with an attention window (sliding_window;
// null in Mistral 7B v0.2 and later). Within the window, sliding-window attention is full causal
// attention: the context is capped at the window, and a longer --ctx is refused (model.cpp).
#include "apps/transformer/hf_family.h"

namespace weft::apps {

ModelConfig read_mistral_config(const ConfigReader& r) {
  ModelConfig c = read_llama_shaped(r, {.n_kv_head = 8, .ctx = 131072});
  c.family = "mistral";
  c.sliding_window = r.j.contains("sliding_window") ? r.integer("sliding_window", 0) : 4096;  // null: none
  if (c.sliding_window > 0) c.ctx = std::min(c.ctx, c.sliding_window);
  return c;
}

nlohmann::json write_mistral_config(const ModelConfig& c) {
  nlohmann::json j = write_llama_config(c);
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp"}) j.erase(llama_only);
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  return j;
}

}  // namespace weft::apps
