#include "apps/transformer/checkpoint_description.h"

#include <fmt/format.h>

#include "apps/common/cli.h"
#include "apps/transformer/hf_checkpoint.h"
#include "core/error.h"
#include "nn/llama.h"

namespace weft::apps::transformer {

std::map<std::string, std::string> model_fields(const apps::ModelConfig& cfg) {
  const nn::LlamaConfig lc = apps::llama_config(cfg);
  return {{"arch", cfg.arch}, {"n_layer", std::to_string(cfg.n_layer)}, {"n_head", std::to_string(cfg.n_head)},
          {"n_kv_head", std::to_string(lc.kv_heads())}, {"d_model", std::to_string(cfg.d_model)},
          {"ffn_dim", std::to_string(cfg.arch == "llama" ? lc.ffn() : cfg.ffn_dim)},
          {"head_dim", std::to_string(lc.head_size())}, {"ctx", std::to_string(cfg.ctx)},
          {"vocab_size", std::to_string(cfg.vocab_size)}, {"tied", cfg.tie_weights ? "1" : "0"},
          {"rope_theta", fmt::format("{}", cfg.rope_theta)}, {"norm_eps", fmt::format("{}", cfg.norm_eps)},
          {"rope_scaling", apps::rope_scaling_text(cfg.rope_scaling)}, {"qkv_bias", cfg.qkv_bias ? "1" : "0"},
          {"qk_norm", cfg.qk_norm ? "1" : "0"},
          {"sliding_window", std::to_string(cfg.sliding_window)}, {"family", cfg.family}};
}

apps::ModelConfig config_of(const std::map<std::string, std::string>& app, const std::string& where) {
  auto get = [&](const std::string& k) {
    auto it = app.find(k);
    WEFT_CHECK(it != app.end(), "transformer: {} is not a weft-transformer checkpoint (no \"{}\" in its description)",
               where, k);
    return it->second;
  };
  WEFT_CHECK(get("format") == kCheckpointFormat, "transformer: {} was written by \"{}\", not weft-transformer", where,
             get("format"));
  apps::ModelConfig cfg;
  auto what = [&](const std::string& k) { return fmt::format("transformer: {}: model field \"{}\"", where, k); };
  auto field = [&](const std::string& k, int64_t lo, int64_t hi) {
    return apps::cli::parse_integer_field(get(k), lo, hi, what(k));
  };
  cfg.n_layer = field("n_layer", 1, apps::kMaxLayers);
  cfg.n_head = field("n_head", 1, apps::kMaxHeads);
  cfg.d_model = field("d_model", 1, apps::kMaxDModel);
  cfg.ctx = field("ctx", 1, apps::kMaxCtx);
  cfg.vocab_size = field("vocab_size", 1, apps::kMaxVocab);
  auto flag = [&](const std::string& k) {
    WEFT_CHECK(get(k) == "0" || get(k) == "1", "{} is \"{}\", not 0 or 1", what(k), get(k));
    return get(k) == "1";
  };
  cfg.tie_weights = flag("tied");
  // Written since the Llama family came; older checkpoints are GPT-2's.
  if (app.count("arch")) {
    cfg.arch = get("arch");
    cfg.n_kv_head = field("n_kv_head", 0, apps::kMaxHeads);
    cfg.ffn_dim = field("ffn_dim", 0, 16 * apps::kMaxDModel);
    cfg.head_dim = field("head_dim", 0, apps::kMaxDModel);
    cfg.rope_theta = apps::cli::parse_positive_field(get("rope_theta"), what("rope_theta"));
    cfg.norm_eps = apps::cli::parse_positive_field(get("norm_eps"), what("norm_eps"));
  }
  if (app.count("rope_scaling")) cfg.rope_scaling = apps::parse_rope_scaling(get("rope_scaling"), fmt::format("{}: model field \"rope_scaling\"", where));
  if (app.count("family")) {  // written since the Mistral and Qwen2 families came
    cfg.family = get("family");
    cfg.qkv_bias = flag("qkv_bias");
    cfg.qk_norm = flag("qk_norm");
    cfg.sliding_window = field("sliding_window", 0, apps::kMaxCtx);
  }
  if (app.count("dropout") && get("dropout") != "0") cfg.dropout = apps::cli::parse_positive_field(get("dropout"), what("dropout"));
  try {
    apps::check_config(cfg);
  } catch (const Error& e) {  // in terms of the flags that would make such a model
    throw Error(fmt::format("{} (the model {} describes)", e.what(), where));
  }
  return cfg;
}

std::map<std::string, std::string> head_alias(const apps::ModelConfig& cfg) {
  if (!cfg.tie_weights) return {};
  return {{apps::kHeadName, apps::embedding_name(cfg)}};
}

std::string lora_base(const std::map<std::string, std::string>& app, const std::string& where, std::string base,
                      const std::string& known) {
  auto digest = app.find("lora_base_sha256"), source = app.find("hf_source");
  if (digest == app.end()) return "";
  WEFT_CHECK(source != app.end(), "transformer: {} records lora_base_sha256 but no hf_source", where);
  if (base.empty()) base = source->second;
  WEFT_CHECK(apps::is_hf_dir(base), "transformer: {} holds the LoRA adapters of {} but not that base model, which is "
             "not a Hugging Face directory here", where, base);
  const std::string have = known.empty() ? apps::hf_weights_digest(base) : known;
  WEFT_CHECK(have == digest->second, "transformer: {} holds LoRA adapters trained on the weights of {} (sha256 {}), "
             "but {}", where, source->second, digest->second, base == source->second ? "that directory's weights have "
             "changed since (sha256 " + have + ")" : "the base given, " + base + ", holds other weights (sha256 " + have + ")");
  return base;
}

}  // namespace weft::apps::transformer
