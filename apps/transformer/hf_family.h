// apps/transformer: what each Hugging Face model_type is to weft, one file per family (hf_gpt2,
// hf_llama, hf_mistral, hf_qwen2, hf_qwen3 .cpp): how its files' tensors differ from weft's
// parameters (whose names are Hugging Face's), and its config.json read into a ModelConfig
// (every field that changes the computation read, or refused naming it) and written back.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/transformer/model.h"

namespace weft::apps {

// config.json's fields, each error naming the file (`where`) and the field.
struct ConfigReader {
  const nlohmann::json& j;
  std::string where;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(fmt::format("transformer: {}: \"{}\" {}", where, key, what));
  }
  const nlohmann::json* find(const std::string& key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const nlohmann::json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail(key, "is missing");
    }
    // Every integer of a config is a size or a count: 0 is not "unset" (that is null or absent).
    if (!v->is_number_integer() || v->get<int64_t>() <= 0)
      fail(key, fmt::format("must be a positive integer, got {}", v->dump()));
    return v->get<int64_t>();
  }
  double number(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    const nlohmann::json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail(key, "is missing");
    }
    if (!v->is_number()) fail(key, fmt::format("must be a number, got {}", v->dump()));
    return v->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("must be true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, fmt::format("must be a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  // A field weft cannot represent unless it has the value weft computes with.
  template <class T> void require(const std::string& key, T got, T want, const std::string& why) const {
    if (got != want) fail(key, fmt::format("is {}: weft supports only {} ({})", nlohmann::json(got).dump(), nlohmann::json(want).dump(), why));
  }
};

struct HfFamily {
  const char* model_type;
  const char* architecture;             // config.json's architectures entry
  std::vector<std::string> transposed;  // name suffixes stored [in, out] (GPT-2's Conv1D)
  std::string optional_prefix;          // files may omit it (the original GPT-2 release does)
  std::vector<std::string> ignored;     // suffixes of tensors weft does not keep (buffers)
  ModelConfig (*read)(const ConfigReader& r);      // config.json -> the model's config
  nlohmann::json (*write)(const ModelConfig& c);  // and back (model_type and architectures: the export's)

  bool is_transposed(const std::string& name) const { return any_suffix(name, transposed); }
  bool is_ignored(const std::string& name) const { return any_suffix(name, ignored); }
  static bool any_suffix(const std::string& name, const std::vector<std::string>& suffixes);
};

// The family of config.json's model_type (an error naming it and the types weft reads otherwise).
const HfFamily& hf_family(const ConfigReader& r);
// The family a model config was read as (ModelConfig::family, or its arch's own family).
const HfFamily& hf_family_of(const ModelConfig& cfg);

// The families' readers and writers (hf_gpt2.cpp, hf_llama.cpp, ...); the Llama-shaped families extend llama's.
ModelConfig read_gpt2_config(const ConfigReader& r);
nlohmann::json write_gpt2_config(const ModelConfig& c);
ModelConfig read_llama_config(const ConfigReader& r);
// What a Llama-shaped family's config.json means by a field it leaves out: transformers' defaults for the family
// (num_key_value_heads, 0: num_attention_heads; max_position_embeddings; head_dim, 0: hidden_size / heads).
struct LlamaDefaults { int64_t n_kv_head = 0, ctx = 2048, head_dim = 0; };
ModelConfig read_llama_shaped(const ConfigReader& r, const LlamaDefaults& defaults);
nlohmann::json write_llama_config(const ModelConfig& c);
ModelConfig read_mistral_config(const ConfigReader& r);
nlohmann::json write_mistral_config(const ModelConfig& c);
ModelConfig read_qwen2_config(const ConfigReader& r);
ModelConfig read_qwen_config(const ConfigReader& r, const LlamaDefaults& defaults);  // Qwen2's and Qwen3's
nlohmann::json write_qwen2_config(const ModelConfig& c);
ModelConfig read_qwen3_config(const ConfigReader& r);
nlohmann::json write_qwen3_config(const ModelConfig& c);

}  // namespace weft::apps
