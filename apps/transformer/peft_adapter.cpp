#include "apps/transformer/peft_adapter.h"
#include "apps/transformer/file_contents.h"

#include <cmath>
#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/lora_settings.h"
#include "core/safetensors.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kConfig = "adapter_config.json";
constexpr const char* kWeights = "adapter_model.safetensors";
const std::string kPrefix = "base_model.model.";

// The fields weft cannot reproduce must hold their "off" values (absent counts as off).
void refuse_unsupported(const json& c, const std::string& file) {
  // Fields that leave the adapters' forward as peft computes it for weft's settings (read here, initialisation
  // methods, bookkeeping); the off() ones join them as they are checked.
  std::set<std::string> known = {"peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "base_model_name_or_path",
      "fan_in_fan_out", "inference_mode", "init_lora_weights", "revision", "auto_mapping", "peft_version", "layers_pattern",
      "megatron_config", "megatron_core", "qalora_group_size", "ensure_weight_tying", "corda_config", "eva_config", "loftq_config", "lora_ga_config"};
  auto off = [&](const char* key, const json& want, const char* what) {
    known.insert(key);
    if (c.contains(key) && !c[key].is_null() && c[key] != want)
      throw Error(fmt::format("transformer: {}: \"{}\" is {}: {} is not supported", file, key, c[key].dump(), what));
  };
  off("use_dora", false, "DoRA (weight-decomposed adapters)");
  off("use_rslora", false, "rsLoRA (scaling by alpha / sqrt(r))");
  off("bias", "none", "training biases with the adapters");
  off("modules_to_save", json::array(), "training whole modules beside the adapters");
  off("rank_pattern", json::object(), "a rank per module");
  off("alpha_pattern", json::object(), "an alpha per module");
  off("layers_to_transform", json::array(), "adapting some layers only");
  off("exclude_modules", json::array(), "excluding modules from target_modules");
  off("lora_bias", false, "a bias on lora_B");
  off("layer_replication", json::array(), "replicated layers");
  off("target_parameters", json::array(), "adapting parameters rather than modules");
  off("trainable_token_indices", json::array(), "training some tokens' embeddings");
  off("use_qalora", false, "QA-LoRA");
  off("task_type", "CAUSAL_LM", "an adapter of a model other than a causal language model");
  // PiSSA, OLoRA, CorDA and LoftQ: peft changes the base weights as it loads the adapters (weft keeps the base as is).
  const json init = c.value("init_lora_weights", json(true));
  const std::string method = init.is_string() ? init.get<std::string>() : "";
  const bool base_changed = method.starts_with("pissa") || method.starts_with("corda") || method == "olora" ||
                            method == "loftq";
  WEFT_CHECK(init.is_null() || init.is_boolean() || method == "gaussian" || method == "eva" ||
                 method == "orthogonal" || method == "mica" || method == "lora_ga",
             "transformer: {}: \"init_lora_weights\" is {}: {}", file, init.dump(),
             base_changed ? "peft changes the base weights for it when it loads the adapter, which weft does not "
                            "reproduce (save the adapter from peft as plain LoRA, with "
                            "path_initial_model_for_weight_conversion)"
                          : "an initialisation weft does not know (true, false, \"gaussian\", \"eva\", \"orthogonal\", "
                            "\"mica\" and \"lora_ga\" leave the base as it is)");
  // Any other field must hold nothing: aLoRA, Arrow, BD-LoRA, KaSA, ... change what the adapters compute, and a
  // newer peft's setting is refused by name rather than ignored.
  for (const auto& [key, v] : c.items())
    if (!known.count(key) && !v.is_null() && v != false && v != json::array() && v != json::object())
      throw Error(fmt::format("transformer: {}: \"{}\" is {}: a peft setting weft does not reproduce", file, key, v.dump()));
}
}  // namespace

bool is_peft_dir(const std::string& dir) { return WEFT_FS(fs::is_regular_file(fs::path(dir) / kConfig)); }

PeftAdapter read_peft_adapter(const std::string& dir) {
  const std::string file = (fs::path(dir) / kConfig).string();
  const json c = read_json_object(file);
  auto field = [&](const char* key) {
    WEFT_CHECK(c.contains(key), "transformer: {} has no \"{}\"", file, key);
    return c[key];
  };
  WEFT_CHECK(field("peft_type") == "LORA", "transformer: {}: \"peft_type\" is {}: only LORA adapters are supported",
             file, field("peft_type").dump());
  refuse_unsupported(c, file);
  PeftAdapter a{.dir = dir};
  WEFT_CHECK(field("r").is_number_integer() && field("lora_alpha").is_number(), "transformer: {}: \"r\" must be an "
             "integer and \"lora_alpha\" a number, got {} and {}", file, field("r").dump(), field("lora_alpha").dump());
  a.lora.rank = field("r").get<int64_t>();
  a.lora.alpha = field("lora_alpha").get<double>();
  const json dropout = c.value("lora_dropout", json(0.0));
  WEFT_CHECK(dropout.is_number(), "transformer: {}: \"lora_dropout\" is {}, not a number", file, dropout.dump());
  a.lora.dropout = dropout.get<double>();
  nn::check_lora_values(a.lora, "transformer: " + file);
  const json targets = field("target_modules");
  if (targets != "all-linear") {  // all-linear: targets left empty
    WEFT_CHECK(targets.is_array() && !targets.empty(), "transformer: {}: \"target_modules\" is {}: a list of module "
               "names or \"all-linear\" (a regular expression is not supported)", file, targets.dump());
    for (const json& t : targets) a.lora.targets.push_back(t.get<std::string>());
  }
  // A relative base: beside the adapter's directory, else from the current directory (as peft wrote it, at the path it
  // was given).
  const json base = c.value("base_model_name_or_path", json());
  if (base.is_string()) {
    const fs::path b = base.get<std::string>();
    a.base = (b.is_absolute() ? b : fs::path(dir) / b).lexically_normal().string();
    if (!b.is_absolute() && !is_hf_dir(a.base) && is_hf_dir(b.string())) a.base = b.lexically_normal().string();
  }
  WEFT_CHECK(is_hf_dir(a.base), "transformer: {}: \"base_model_name_or_path\" is {}, which is not a Hugging Face model "
             "directory (a config.json) at {}{}", file, base.dump(), a.base.empty() ? "any path" : a.base,
             base.is_string() && !fs::path(base.get<std::string>()).is_absolute() ? " nor from the current directory" : "");
  return a;
}

void load_peft_weights(const PeftAdapter& adapter, const LanguageModel& model, const fsdp::FSDPModule* root) {
  const std::string file = (fs::path(adapter.dir) / kWeights).string();
  fsdp::ExternalNames names;
  for (auto& [name, p] : model.module->named_parameters())
    if (nn::is_lora_parameter(name)) names[name] = {file, kPrefix + name, false};
  std::set<std::string> expected;
  for (auto& [name, src] : names) expected.insert(src.name);
  for (const SafetensorsEntry& stored : read_safetensors_index(file))
    WEFT_CHECK(expected.count(stored.name), "transformer: {} holds \"{}\", which the adapters {} describes do not "
               "have{}", file, stored.name, (fs::path(adapter.dir) / kConfig).string(), stored.name.ends_with(
               "base_layer.weight") ? " (peft saves a base layer beside its adapters with save_embedding_layers, as "
               "for an adapted lm_head or embedding: weft reads adapters only; save with save_embedding_layers=False)"
               : "");
  fsdp::load_external_checkpoint(*model.module, root, names, [](const std::string& n) { return !nn::is_lora_parameter(n); });
}

void export_peft_adapter(const LanguageModel& model, const nn::LoRAOptions& lora, const std::string& out,
                         const std::string& base) {
  WEFT_CHECK(lora.rank > 0, "transformer: export-peft: the model has no LoRA adapters");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, p] : model.module->named_parameters())
    if (nn::is_lora_parameter(name)) tensors.emplace_back(kPrefix + name, p.detach().to(kCPU).to(kFloat32).contiguous());
  const json config = {{"peft_type", "LORA"}, {"task_type", "CAUSAL_LM"},
                       {"base_model_name_or_path", base.empty() ? json() : json(base)}, {"r", lora.rank},
                       {"lora_alpha", lora.alpha}, {"lora_dropout", lora.dropout}, {"target_modules", lora.targets},
                       {"bias", "none"}, {"fan_in_fan_out", model.cfg.arch == "gpt2"}, {"inference_mode", true},
                       {"init_lora_weights", true}, {"modules_to_save", json()}, {"use_rslora", false},
                       {"use_dora", false}, {"rank_pattern", json::object()}, {"alpha_pattern", json::object()},
                       {"layers_to_transform", json()}, {"revision", json()}};
  write_new_directory(out, "export-peft", [&](const fs::path& tmp) {
    save_safetensors((tmp / kWeights).string(), tensors, {{"format", "pt"}});
    write_file((tmp / kConfig).string(), config.dump(2));
  });
}

}  // namespace weft::apps
