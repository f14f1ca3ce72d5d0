#include "apps/transformer/hf_family.h"

#include <algorithm>

namespace weft::apps {
namespace {

const HfFamily kFamilies[] = {
    {"gpt2", "GPT2LMHeadModel", {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"},
     "transformer.", {"attn.bias", "attn.masked_bias"}, read_gpt2_config, write_gpt2_config},
    {"llama", "LlamaForCausalLM", {}, "", {"rotary_emb.inv_freq"}, read_llama_config, write_llama_config},
    {"mistral", "MistralForCausalLM", {}, "", {"rotary_emb.inv_freq"}, read_mistral_config, write_mistral_config},
    {"qwen2", "Qwen2ForCausalLM", {}, "", {"rotary_emb.inv_freq"}, read_qwen2_config, write_qwen2_config},
    {"qwen3", "Qwen3ForCausalLM", {}, "", {"rotary_emb.inv_freq"}, read_qwen3_config, write_qwen3_config},
};

}  // namespace

bool HfFamily::any_suffix(const std::string& name, const std::vector<std::string>& suffixes) {
  return std::any_of(suffixes.begin(), suffixes.end(), [&](const std::string& s) { return name.ends_with(s); });
}

const HfFamily& hf_family(const ConfigReader& r) {
  const std::string type = r.text("model_type", "");
  for (const HfFamily& f : kFamilies)
    if (type == f.model_type) return f;
  r.fail("model_type", fmt::format("is \"{}\": weft reads gpt2, llama, mistral, qwen2 and qwen3", type));
}

const HfFamily& hf_family_of(const ModelConfig& cfg) {
  const std::string& type = cfg.family.empty() ? cfg.arch : cfg.family;
  for (const HfFamily& f : kFamilies)
    if (type == f.model_type) return f;
  throw Error(fmt::format("transformer: no Hugging Face family \"{}\"", type));
}

}  // namespace weft::apps
