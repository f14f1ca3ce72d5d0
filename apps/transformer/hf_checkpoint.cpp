#include "apps/transformer/hf_checkpoint.h"

#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.h"
#include "core/safetensors.h"

namespace weft::apps {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- the mapping, per model_type: everything in which Hugging Face's layout differs from
// weft's parameters (whose names are the same).
struct HfLayout {
  const char* model_type;
  const char* architecture;
  std::vector<std::string> transposed;  // name suffixes stored [in, out] (GPT-2's Conv1D)
  std::string optional_prefix;          // files may omit it (the original GPT-2 release does)
  std::vector<std::string> ignored;     // suffixes of tensors weft does not keep (buffers)

  static bool any_suffix(const std::string& name, const std::vector<std::string>& suffixes) {
    return std::any_of(suffixes.begin(), suffixes.end(), [&](const std::string& s) { return name.ends_with(s); });
  }
  bool is_transposed(const std::string& name) const { return any_suffix(name, transposed); }
  bool is_ignored(const std::string& name) const { return any_suffix(name, ignored); }
};

const HfLayout kGpt2{"gpt2",
                     "GPT2LMHeadModel",
                     {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"},
                     "transformer.",
                     {"attn.bias", "attn.masked_bias"}};
const HfLayout kLlama{"llama", "LlamaForCausalLM", {}, "", {"rotary_emb.inv_freq"}};

const HfLayout& layout_of(const ModelConfig& cfg) { return cfg.arch == "llama" ? kLlama : kGpt2; }

// ---- config.json

struct ConfigReader {
  const json& j;
  std::string where;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(fmt::format("transformer: {}: \"{}\" {}", where, key, what));
  }
  const json* find(const std::string& key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
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
    const json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail(key, "is missing");
    }
    if (!v->is_number()) fail(key, fmt::format("must be a number, got {}", v->dump()));
    return v->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("must be true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  std::string text(const std::string& key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, fmt::format("must be a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  // A field weft cannot represent unless it has the value weft computes with.
  template <class T> void require(const std::string& key, T got, T want, const std::string& why) const {
    if (got != want) fail(key, fmt::format("is {}: weft supports only {} ({})", json(got).dump(), json(want).dump(), why));
  }
};

ModelConfig gpt2_config(const ConfigReader& r) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = r.integer("vocab_size");
  c.ctx = r.integer("n_positions");
  c.d_model = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.ffn_dim = r.integer("n_inner", 0);
  const std::string act = r.text("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    r.fail("activation_function", fmt::format("is \"{}\": weft's GPT-2 uses the tanh GELU (gelu_new)", act));
  r.require("layer_norm_epsilon", r.number("layer_norm_epsilon", 1e-5), 1e-5, "weft's GPT-2 LayerNorm eps");
  r.require("scale_attn_weights", r.boolean("scale_attn_weights", true), true, "scores scaled by 1/sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", r.boolean("scale_attn_by_inverse_layer_idx", false), false,
            "no per-layer score scaling");
  r.require("add_cross_attention", r.boolean("add_cross_attention", false), false, "a decoder only");
  c.tie_weights = r.boolean("tie_word_embeddings", true);
  return c;
}

// rope_scaling, or the rope_parameters of newer files (which also hold rope_theta): the rope type
// and its numbers (kernels/rope.h); a type weft does not compute, or a field it would ignore, is
// an error naming it. `max_positions`: max_position_embeddings, where dynamic scaling starts.
kernels::RopeScaling rope_scaling_of(const ConfigReader& r, int64_t max_positions) {
  using Kind = kernels::RopeScaling::Kind;
  const std::string type = r.find("rope_type") ? r.text("rope_type", "") : r.text("type", "default");
  static const std::map<std::string, std::pair<Kind, std::set<std::string>>> kTypes = {
      {"default", {Kind::none, {}}},
      {"linear", {Kind::linear, {"factor"}}},
      {"dynamic", {Kind::dynamic, {"factor", "original_max_position_embeddings"}}},
      {"llama3", {Kind::llama3, {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}}}};
  auto it = kTypes.find(type);
  if (it == kTypes.end())
    r.fail(r.find("rope_type") ? "rope_type" : "type",
           fmt::format("is \"{}\": weft computes the rope types default, linear, dynamic and llama3", type));
  for (auto& [key, value] : r.j.items()) {
    if (key == "rope_type" || key == "type" || key == "rope_theta" || key == "partial_rotary_factor" ||
        it->second.second.count(key) || value.is_null())
      continue;
    r.fail(key, fmt::format("is {}: weft does not use it with rope type {} (only {})", value.dump(), type,
                            it->second.second.empty() ? "rope_theta" : fmt::format("{}", fmt::join(it->second.second, ", "))));
  }
  r.require("partial_rotary_factor", r.number("partial_rotary_factor", 1.0), 1.0, "every channel rotated");
  kernels::RopeScaling s{.kind = it->second.first};
  if (s.kind == Kind::none) return s;
  s.factor = r.number("factor");
  // Dynamic scaling leaves the frequencies as they are up to max_position_embeddings (or an
  // original_max_position_embeddings in rope_scaling, the smaller of the two taken).
  if (s.kind == Kind::dynamic)
    s.original_context = std::min(max_positions, r.integer("original_max_position_embeddings", max_positions));
  if (s.kind == Kind::llama3) {
    s.low_freq_factor = r.number("low_freq_factor");
    s.high_freq_factor = r.number("high_freq_factor");
    s.original_context = r.integer("original_max_position_embeddings", max_positions);
  }
  try {
    kernels::check_rope_scaling("transformer", s);
  } catch (const Error& e) {
    throw Error(fmt::format("{} (from {})", e.what(), r.where));
  }
  return s;
}

json rope_scaling_config(const kernels::RopeScaling& s) {
  using Kind = kernels::RopeScaling::Kind;
  if (s.kind == Kind::none) return nullptr;
  json j = {{"rope_type", kernels::rope_scaling_name(s.kind)}, {"factor", s.factor}};
  if (s.kind != Kind::linear) j["original_max_position_embeddings"] = s.original_context;
  if (s.kind == Kind::llama3) j["low_freq_factor"] = s.low_freq_factor, j["high_freq_factor"] = s.high_freq_factor;
  return j;
}

ModelConfig llama_config_of(const ConfigReader& r) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("hidden_size");
  c.ffn_dim = r.integer("intermediate_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = r.integer("num_key_value_heads", c.n_head);
  c.head_dim = r.integer("head_dim", 0);
  if (c.head_dim > 0 && c.n_head > 0 && c.head_dim * c.n_head == c.d_model) c.head_dim = 0;  // the default
  c.ctx = r.integer("max_position_embeddings", 2048);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.rope_theta = r.number("rope_theta", 10000.0);
  r.require("partial_rotary_factor", r.number("partial_rotary_factor", 1.0), 1.0, "every channel rotated");
  // Newer files put theta and the scaling in "rope_parameters".
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* p = r.find(key);
    if (!p) continue;
    if (!p->is_object()) r.fail(key, fmt::format("must be an object or null, got {}", p->dump()));
    ConfigReader rp{*p, fmt::format("{} {}", r.where, key)};
    c.rope_theta = rp.number("rope_theta", c.rope_theta);
    c.rope_scaling = rope_scaling_of(rp, c.ctx);
  }
  // As transformers: a top-level original_max_position_embeddings wins over llama3's own.
  if (c.rope_scaling.kind == kernels::RopeScaling::Kind::llama3)
    c.rope_scaling.original_context = r.integer("original_max_position_embeddings", c.rope_scaling.original_context);
  r.require("hidden_act", r.text("hidden_act", "silu"), std::string("silu"), "SwiGLU with SiLU");
  r.require("attention_bias", r.boolean("attention_bias", false), false, "bias-free projections");
  r.require("mlp_bias", r.boolean("mlp_bias", false), false, "bias-free projections");
  r.require("pretraining_tp", r.integer("pretraining_tp", 1), int64_t(1), "unsplit projections");
  c.tie_weights = r.boolean("tie_word_embeddings", false);
  return c;
}

// Hugging Face tensor name -> the file holding it.
std::map<std::string, std::string> weight_files(const std::string& dir) {
  std::map<std::string, std::string> out;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json", single = fs::path(dir) / "model.safetensors";
  if (fs::exists(index) && !fs::exists(single)) {  // both: the single file, as transformers reads it
    std::ifstream in(index);
    json j = json::parse(in, nullptr, false);
    WEFT_CHECK(!j.is_discarded() && j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
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
  WEFT_CHECK(fs::exists(single), "transformer: {} has neither model.safetensors nor model.safetensors.index.json "
             "(weft reads the safetensors format only, not pytorch_model.bin)", dir);
  for (const SafetensorsEntry& e : read_safetensors_index(single.string())) out[e.name] = single.string();
  return out;
}

}  // namespace

std::string rope_scaling_text(const kernels::RopeScaling& s) { return rope_scaling_config(s).dump(); }

kernels::RopeScaling parse_rope_scaling(const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_null()) return {};
  WEFT_CHECK(j.is_object(), "transformer: {}: rope scaling must be a JSON object or null, got {}", where, text);
  return rope_scaling_of(ConfigReader{j, where}, std::numeric_limits<int64_t>::max());
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(fs::path(path) / "config.json", ec);
}

ModelConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::ifstream in(path);
  WEFT_CHECK(in.good(), "transformer: cannot read {}", path);
  json j = json::parse(in, nullptr, false);
  WEFT_CHECK(!j.is_discarded() && j.is_object(), "transformer: {} is not a JSON object", path);
  ConfigReader r{j, path};
  const std::string type = r.text("model_type", "");
  ModelConfig cfg;
  if (type == "gpt2") cfg = gpt2_config(r);
  else if (type == "llama") cfg = llama_config_of(r);
  else r.fail("model_type", fmt::format("is \"{}\": weft reads gpt2 and llama", type));
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

void load_hf_checkpoint(const std::string& dir, const LanguageModel& model, const fsdp::FSDPModule* root) {
  const HfLayout& layout = layout_of(model.cfg);
  const std::map<std::string, std::string> files = weight_files(dir);
  fsdp::ExternalNames names;
  std::set<std::string> used;
  for (auto& [name, p] : model.module->named_parameters()) {  // a tied tensor once, under its first name
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
  fsdp::load_external_checkpoint(*model.module, root, names);
}

namespace {

// The directory an export to `out` is written in, beside it: .<name>.tmp-<pid>, renamed to `out`
// when complete. Leftovers of earlier exports to `out` whose process is gone are removed first.
fs::path export_temp_dir(const std::string& out) {
  const fs::path parent = fs::path(out).parent_path().empty() ? fs::path(".") : fs::path(out).parent_path();
  const std::string prefix = fmt::format(".{}.tmp-", fs::path(out).filename().string());
  std::error_code ec;
  for (auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string(), pid = name.substr(std::min(name.size(), prefix.size()));
    if (name.rfind(prefix, 0) != 0 || pid.empty() || pid.size() > 9 ||
        pid.find_first_not_of("0123456789") != std::string::npos)
      continue;
    if (::kill(pid_t(std::stoi(pid)), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);  // its export died
  }
  const fs::path tmp = parent / (prefix + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
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
    write_file_atomic((tmp / "model.safetensors.index.json").string(),
                      [&](std::FILE* f) { std::fwrite(index.data(), 1, index.size(), f); });
  }
  const std::string text = cfg.dump(2);
  write_file_atomic((tmp / "config.json").string(), [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

}  // namespace

void export_hf_checkpoint(const LanguageModel& model, const std::string& out, int64_t max_shard_bytes) {
  WEFT_CHECK(!out.empty() && fs::path(out).has_filename(), "transformer: --out \"{}\" does not name a directory to "
             "write", out);
  WEFT_CHECK(!fs::exists(out), "transformer: {} already exists: export-hf writes a new directory (choose another --out "
             "or remove it)", out);
  WEFT_CHECK(max_shard_bytes > 0, "transformer: the shard size must be positive, got {}", max_shard_bytes);
  const ModelConfig& c = model.cfg;
  const HfLayout& layout = layout_of(c);
  // The tensors, in the model's order, each as Hugging Face stores it.
  NamedTensors tensors;
  for (auto& [name, p] : model.module->named_parameters()) {
    Tensor t = p.detach().to(kCPU);
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
  json cfg;
  if (c.arch == "llama") {
    const nn::LlamaConfig lc = llama_config(c);
    // Dynamic scaling starts at max_position_embeddings: where the model's starts, past a shorter --ctx.
    const int64_t max_positions = c.rope_scaling.kind == kernels::RopeScaling::Kind::dynamic
                                      ? std::max(c.ctx, c.rope_scaling.original_context) : c.ctx;
    cfg = {{"architectures", {layout.architecture}}, {"model_type", "llama"}, {"vocab_size", c.vocab_size},
           {"hidden_size", c.d_model}, {"intermediate_size", lc.ffn()}, {"num_hidden_layers", c.n_layer},
           {"num_attention_heads", c.n_head}, {"num_key_value_heads", lc.kv_heads()}, {"head_dim", lc.head_size()},
           {"max_position_embeddings", max_positions}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
           {"rope_scaling", rope_scaling_config(c.rope_scaling)}, {"hidden_act", "silu"}, {"attention_bias", false}, {"mlp_bias", false},
           {"attention_dropout", 0.0}, {"initializer_range", 0.02}, {"pretraining_tp", 1},
           {"tie_word_embeddings", c.tie_weights}, {"torch_dtype", "float32"}, {"use_cache", true}};
  } else {
    cfg = {{"architectures", {layout.architecture}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
           {"n_positions", c.ctx}, {"n_ctx", c.ctx}, {"n_embd", c.d_model}, {"n_layer", c.n_layer},
           {"n_head", c.n_head}, {"n_inner", c.ffn_dim > 0 ? json(c.ffn_dim) : json(nullptr)},
           {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}, {"resid_pdrop", 0.0},
           {"embd_pdrop", 0.0}, {"attn_pdrop", 0.0}, {"scale_attn_weights", true},
           {"tie_word_embeddings", c.tie_weights}, {"torch_dtype", "float32"}, {"use_cache", true}};
  }
  fs::path tmp;
  try {
    tmp = export_temp_dir(out);
    write_hf_files(tmp, shards, total, cfg);
    fs::rename(tmp, out);
  } catch (const std::exception& e) {
    std::error_code ec;
    if (!tmp.empty()) fs::remove_all(tmp, ec);
    throw Error(fmt::format("transformer: exporting to {} failed (nothing was written there): {}", out, e.what()));
  }
}

}  // namespace weft::apps

