#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/file_contents.h"

#include <unistd.h>

#include <cmath>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "apps/transformer/hf_family.h"
#include "core/atomic_file.h"
#include "core/element_search.h"
#include "core/safetensors.h"
#include "core/sha256.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Hugging Face tensor name -> the file holding it.
std::map<std::string, std::string> weight_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json", single = fs::path(dir) / "model.safetensors";
  if (WEFT_FS(fs::exists(index)) && !WEFT_FS(fs::exists(single))) {  // both: the single file, as transformers reads it
    json j = read_json_object(index.string());
    WEFT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(),
               "transformer: {} is not a safetensors index (a JSON object with a \"weight_map\" object)",
               index.string());
    for (auto& [name, file] : j["weight_map"].items()) {
      WEFT_CHECK(file.is_string() && file.get<std::string>().find('/') == std::string::npos,
                 "transformer: {}: the file of \"{}\" must be a file name in the same directory, got {}",
                 index.string(), name, file.dump());
      out[name] = (fs::path(dir) / file.get<std::string>()).string();
    }
    return out;
  }
  WEFT_CHECK(WEFT_FS(fs::exists(single)), "transformer: {} has neither model.safetensors nor model.safetensors.index.json "
             "(weft reads the safetensors format only, not pytorch_model.bin)", dir);
  for (const SafetensorsEntry& e : read_safetensors_index(single.string())) out[e.name] = single.string();
  return out;
}

}  // namespace

HfGenerationConfig read_hf_generation_config(const std::string& dir) {
  fs::path path = fs::path(dir) / "generation_config.json";
  HfGenerationConfig g;
  if (!WEFT_FS(fs::exists(path))) path = fs::path(dir) / "config.json";
  if (!WEFT_FS(fs::exists(path))) return g;
  g.found = true, g.file = path.string();
  const json j = read_json_object(path.string());
  const json eos = j.value("eos_token_id", json(nullptr));
  for (const json& id : eos.is_array() ? eos : json::array({eos})) {
    if (id.is_null()) continue;
    WEFT_CHECK(id.is_number_integer(), "transformer: {}: \"eos_token_id\" must be token ids, got {}", path.string(),
               eos.dump());
    g.eos.push_back(id.get<int64_t>());
  }
  auto field = [&](const char* key, auto& value, bool ok(double)) {
    if (!j.contains(key) || j[key].is_null()) return;
    const json& v = j[key];
    const bool flag = std::is_same_v<std::decay_t<decltype(value)>, bool>;
    WEFT_CHECK(flag ? v.is_boolean() : v.is_number() && ok(v.get<double>()),
               "transformer: {}: \"{}\" is {}, which weft cannot sample with", path.string(), key, v.dump());
    value = v.get<std::decay_t<decltype(value)>>();
  };
  field("do_sample", g.do_sample, nullptr);
  field("temperature", g.temperature, [](double x) { return x >= 0 && std::isfinite(x); });
  field("top_k", g.top_k, [](double x) { return x >= 0 && x == std::floor(x) && x < 1e9; });
  field("top_p", g.top_p, [](double x) { return x > 0 && x <= 1; });
  field("repetition_penalty", g.repetition_penalty, [](double x) { return x > 0 && std::isfinite(x); });
  // What else changes generation (transformers' logits processors, beams): named when set away from neutral.
  for (const auto& [key, neutral] : std::initializer_list<std::pair<const char*, json>>{
           {"no_repeat_ngram_size", 0}, {"min_new_tokens", 0}, {"min_length", 0},
           {"num_beams", 1}, {"typical_p", 1.0}, {"epsilon_cutoff", 0.0}, {"eta_cutoff", 0.0}, {"min_p", 0.0},
           {"encoder_repetition_penalty", 1.0}, {"bad_words_ids", nullptr}, {"suppress_tokens", nullptr},
           {"begin_suppress_tokens", nullptr}, {"forced_bos_token_id", nullptr}, {"forced_eos_token_id", nullptr},
           {"sequence_bias", nullptr}, {"exponential_decay_length_penalty", nullptr}, {"penalty_alpha", nullptr},
           {"stop_strings", nullptr}, {"max_new_tokens", nullptr}, {"max_length", nullptr}, {"guidance_scale", nullptr},
           {"length_penalty", 1.0}, {"num_beam_groups", 1}, {"diversity_penalty", 0.0}, {"watermarking_config", nullptr}})
    if (j.contains(key) && !j[key].is_null() && j[key] != neutral) g.ignored.push_back(fmt::format("{} {}", key, j[key].dump()));
  return g;
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

void check_tokenizer_readable(const std::string& dir, const std::string& what) {
  WEFT_CHECK(dir.empty() || !WEFT_FS(fs::exists(fs::path(dir) / "tokenizer.model")) ||
             WEFT_FS(fs::exists(fs::path(dir) / "tokenizer.json")), "transformer: {} holds tokenizer.model "
             "(SentencePiece's format) and no tokenizer.json, the one weft reads: {} would be read as bytes, ids the "
             "model was not made for; write its tokenizer.json first (Python: transformers.AutoTokenizer."
             "from_pretrained(DIR).save_pretrained(DIR))", dir, what);
}

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  json j = read_json_object(path);
  ConfigReader r{j, path};
  ModelConfig cfg = hf_family(r).read(r);
  try {
    check_config(cfg);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (from {})", e.what(), path));
  }
  // A stored head wins over the tie flag, as transformers loads it: the model's head is its own.
  if (const auto files = weight_files(dir); cfg.tie_weights && files.count(kHeadName)) {
    cfg.tie_weights = false;
    std::fprintf(stderr, "weft-transformer: %s sets tie_word_embeddings but %s stores %s: the stored head is used "
                 "(untied)\n", path.c_str(), files.at(kHeadName).c_str(), kHeadName);
  }
  return cfg;
}

std::string hf_weights_digest(const std::string& dir) {
  std::set<std::string> files;
  for (auto& [name, file] : weight_files(dir)) files.insert(file);
  std::string text;
  for (const std::string& file : files) text += fs::path(file).filename().string() + " " + sha256_file(file) + "\n";
  return sha256_hex(text.data(), text.size());
}

// Where each parameter of `model` but its LoRA adapters is stored in the Hugging Face model `dir`.
static fsdp::ExternalNames hf_names(const std::string& dir, const LanguageModel& model) {
  const HfFamily& layout = hf_family_of(model.cfg);
  const std::map<std::string, std::string> files = weight_files(dir);
  fsdp::ExternalNames names;
  std::set<std::string> used;
  for (auto& [name, p] : model.module->named_parameters()) {  // a tied tensor once, under its first name
    if (nn::is_lora_parameter(name)) continue;  // adapters a run added: they keep their initial values
    std::string hf = name;
    if (!files.count(hf) && !layout.optional_prefix.empty() && name.rfind(layout.optional_prefix, 0) == 0)
      hf = name.substr(layout.optional_prefix.size());
    auto it = files.find(hf);
    WEFT_CHECK(it != files.end(), "transformer: {} has no weights for \"{}\" (a {} model of this config needs them)",
               dir, name, layout.model_type);
    names[name] = {it->second, hf, layout.is_transposed(name)};
    used.insert(hf);
  }
  for (const auto& [hf, file] : files) {
    if (used.count(hf)) continue;
    WEFT_CHECK(layout.is_ignored(hf), "transformer: {} holds \"{}\" ({}), which a {} model of this config does not "
               "have", dir, hf, file, layout.model_type);
  }
  return names;
}

void load_hf_checkpoint(const std::string& dir, const LanguageModel& model, const fsdp::FSDPModule* root) {
  fsdp::load_external_checkpoint(*model.module, root, hf_names(dir, model), nn::is_lora_parameter);
}

int64_t hf_load_bytes(const std::string& dir, const LanguageModel& model, const fsdp::FSDPModule* root, Device device) {
  return fsdp::external_load_bytes(*model.module, root, hf_names(dir, model), device, nn::is_lora_parameter);
}

namespace {

// The directory an export to `out` is written in, beside it: .<name>.tmp-<pid>, renamed to `out`
// when complete. Leftovers of earlier exports to `out` whose process is gone are removed first.
fs::path export_temp_dir(const std::string& out) {
  const fs::path parent = fs::path(out).parent_path().empty() ? fs::path(".") : fs::path(out).parent_path();
  const std::string prefix = fmt::format(".{}.tmp-", fs::path(out).filename().string());
  std::error_code ec;
  for (auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && temp_owner_gone(name.substr(prefix.size()))) fs::remove_all(e.path(), ec);
  }
  const fs::path tmp = parent / (prefix + std::to_string(::getpid()));
  WEFT_FS(fs::remove_all(tmp));
  WEFT_FS(fs::create_directories(tmp));
  return tmp;
}

// config.json and the safetensors shards (with their index when there are several) into `tmp`.
void write_hf_files(const fs::path& tmp, const std::vector<NamedTensors>& shards, int64_t total, const json& cfg) {
  const Metadata meta{{"format", "pt"}};
  if (shards.size() == 1) {
    save_safetensors((tmp / "model.safetensors").string(), shards[0], meta);
  } else {
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      save_safetensors((tmp / file).string(), shards[i], meta);
      for (auto& nt : shards[i]) weight_map[nt.first] = file;
    }
    const std::string index = json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2);
    write_file((tmp / "model.safetensors.index.json").string(), index);
  }
  write_file((tmp / "config.json").string(), cfg.dump(2));
}

}  // namespace

void export_hf_checkpoint(const LanguageModel& model, const std::string& out, int64_t max_shard_bytes, DType dtype,
                          const std::string& source, bool source_tokens) {
  WEFT_CHECK(max_shard_bytes > 0, "transformer: the shard size must be positive, got {}", max_shard_bytes);
  WEFT_CHECK(dtype == kFloat32 || dtype == kBFloat16, "transformer: export-hf writes f32 or bf16, not {}",
             dtype_name(dtype));
  const ModelConfig& c = model.cfg;
  const HfFamily& layout = hf_family_of(c);
  // The tensors, in the model's order, each as Hugging Face stores it.
  NamedTensors tensors;
  for (auto& [name, p] : model.module->named_parameters()) {
    Tensor t = p.detach().to(kCPU).to(dtype);
    if (auto bad = find_nonfinite(t))  // a finite f32 weight past bf16's range rounds to infinity
      WEFT_ERROR("transformer: \"{}\" holds {} in {} (its weights reach past {}'s range): nothing was written to {}",
                 name, bad->str(), dtype_name(dtype), dtype_name(dtype), out);
    tensors.emplace_back(name, layout.is_transposed(name) ? t.transpose(0, 1).contiguous() : t.contiguous());
  }
  // Shards of at most max_shard_bytes (a larger tensor alone in its shard).
  std::vector<NamedTensors> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (auto& nt : tensors) {
    const int64_t bytes = nt.second.numel() * int64_t(dtype_size(nt.second.dtype()));
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) shards.emplace_back(), shard_bytes = 0;
    shards.back().push_back(nt);
    shard_bytes += bytes, total += bytes;
  }
  json cfg = layout.write(c);
  const json src = source.empty() ? json() : json::parse(read_file((fs::path(source) / "config.json").string()), nullptr, false);
  if (src.is_object()) {  // fine-tuned at a shorter --ctx, a rotary model keeps its source's
    if (const json m = src.value("max_position_embeddings", json()); c.arch == "llama" && m.is_number_integer())
      cfg["max_position_embeddings"] = std::max(cfg.value("max_position_embeddings", int64_t(0)), m.get<int64_t>());
    for (const auto& [key, value] : src.items())  // the rest as downloaded (read, and left as it was); its token ids
      if (source_tokens || !key.ends_with("_token_id")) cfg.emplace(key, value);  // where the run kept its tokens
  }
  for (const char* key : {"bos_token_id", "eos_token_id"}) cfg.emplace(key, nullptr);  // none, as sample: not a default of another vocabulary
  cfg["model_type"] = layout.model_type;
  cfg["architectures"] = {layout.architecture};
  cfg["torch_dtype"] = cfg["dtype"] = dtype == kBFloat16 ? "bfloat16" : "float32";  // transformers 4's key, 5's
  write_new_directory(out, "export-hf", [&](const fs::path& tmp) {
    write_hf_files(tmp, shards, total, cfg);
    // The tokenizer's, chat template's and generation's files, as downloaded; the tokenizer's only with the tokenizer
    // itself (a tokenizer_config.json alone fails AutoTokenizer).
    auto there = [&](const char* name) { return !source.empty() && WEFT_FS(fs::exists(fs::path(source) / name)); };
    const bool tokenizer = there("tokenizer.json") || there("tokenizer.model");
    for (const char* name : kHfSideFiles) {
      if (!source_tokens || !there(name)) continue;
      if (tokenizer || name == std::string("generation_config.json"))
        write_file((tmp / name).string(), read_file((fs::path(source) / name).string()));  // a full disk named as such
      else
        std::fprintf(stderr, "weft-transformer: %s has %s but no tokenizer.json (or tokenizer.model): not copied\n",
                     source.c_str(), name);
    }
  });
}

void write_new_directory(const std::string& out, const char* command,
                         const std::function<void(const std::filesystem::path&)>& write) {
  const fs::path dst = fs::path(out).has_filename() ? fs::path(out) : fs::path(out).parent_path();  // "DIR/" as DIR
  WEFT_CHECK(dst.has_filename(), "transformer: --out \"{}\" does not name a directory to write", out);
  WEFT_CHECK(!WEFT_FS(fs::exists(dst)), "transformer: {} already exists: {} writes a new directory (choose another --out or "
             "remove it)", out, command);
  fs::path tmp;
  try {
    tmp = export_temp_dir(dst.string());
    write(tmp);
    WEFT_FS(fs::rename(tmp, dst));
  } catch (const std::exception& e) {
    std::error_code ec;
    if (!tmp.empty()) fs::remove_all(tmp, ec);
    throw Error(fmt::format("transformer: exporting to {} failed (nothing was written there): {}", out, e.what()));
  }
}

}  // namespace weft::apps

