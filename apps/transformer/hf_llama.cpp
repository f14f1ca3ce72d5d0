// llama: LlamaForCausalLM (nn/llama.h), its rope scaling (kernels/rope.h); Mistral's and Qwen's build on it.
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "apps/transformer/hf_checkpoint.h"
#include "apps/transformer/hf_family.h"

namespace weft::apps {
using nlohmann::json;
namespace {

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
  // Dynamic scaling leaves the frequencies as they are up to max_position_embeddings, whatever an
  // original_max_position_embeddings in rope_scaling says (as transformers); a checkpoint's record (no max_positions)
  // holds where it starts as that field.
  if (s.kind == Kind::dynamic)
    s.original_context = max_positions < std::numeric_limits<int64_t>::max()
                             ? max_positions : r.integer("original_max_position_embeddings");
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
  if (s.kind == Kind::llama3) j.update({{"low_freq_factor", s.low_freq_factor}, {"high_freq_factor", s.high_freq_factor}});
  return j;
}

}  // namespace

ModelConfig read_llama_config(const ConfigReader& r) { return read_llama_shaped(r, {}); }

ModelConfig read_llama_shaped(const ConfigReader& r, const LlamaDefaults& d) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = r.integer("vocab_size");
  c.d_model = r.integer("hidden_size");
  c.ffn_dim = r.integer("intermediate_size");
  c.n_layer = r.integer("num_hidden_layers");
  c.n_head = r.integer("num_attention_heads");
  c.n_kv_head = r.integer("num_key_value_heads", d.n_kv_head > 0 ? d.n_kv_head : c.n_head);
  c.head_dim = r.integer("head_dim", d.head_dim);
  if (c.head_dim > 0 && c.n_head > 0 && c.head_dim * c.n_head == c.d_model) c.head_dim = 0;  // the default
  c.ctx = r.integer("max_position_embeddings", d.ctx);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.rope_theta = r.number("rope_theta", 10000.0);
  r.require("partial_rotary_factor", r.number("partial_rotary_factor", 1.0), 1.0, "every channel rotated");
  // Newer files put theta and the scaling in "rope_parameters"; a file with both must not have them disagree (which
  // one transformers takes depends on its version).
  std::optional<std::pair<kernels::RopeScaling, std::optional<double>>> first;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* p = r.find(key);
    if (!p) continue;
    if (!p->is_object()) r.fail(key, fmt::format("must be an object or null, got {}", p->dump()));
    ConfigReader rp{*p, fmt::format("{} {}", r.where, key)};
    const auto theta = p->contains("rope_theta") ? std::optional(rp.number("rope_theta", 0.0)) : std::nullopt;
    if (theta && r.find("rope_theta") && *theta != c.rope_theta)
      r.fail("rope_theta", fmt::format("is {}, and {}'s rope_theta {}: keep the one the model was trained with",
                                       c.rope_theta, key, *theta));
    c.rope_theta = theta.value_or(c.rope_theta);
    c.rope_scaling = rope_scaling_of(rp, c.ctx);
    if (first && (!(first->first == c.rope_scaling) || (first->second && theta && *first->second != *theta)))
      r.fail(key, "differs from rope_scaling in the same file: keep the one the model was trained with");
    first.emplace(c.rope_scaling, theta);
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

json write_llama_config(const ModelConfig& c) {
  const nn::LlamaConfig lc = llama_config(c);
  // Dynamic scaling starts at max_position_embeddings: where the model's starts, past a shorter --ctx.
  const int64_t max_positions = c.rope_scaling.kind == kernels::RopeScaling::Kind::dynamic
                                    ? std::max(c.ctx, c.rope_scaling.original_context) : c.ctx;
  return {{"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model}, {"intermediate_size", lc.ffn()}, {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head}, {"num_key_value_heads", lc.kv_heads()}, {"head_dim", lc.head_size()},
          {"max_position_embeddings", max_positions}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
          {"rope_scaling", rope_scaling_config(c.rope_scaling)}, {"hidden_act", "silu"}, {"attention_bias", false},
          {"mlp_bias", false}, {"attention_dropout", c.dropout}, {"pretraining_tp", 1},  // initializer_range: the source's
          {"tie_word_embeddings", c.tie_weights}, {"torch_dtype", "float32"}, {"use_cache", true}};
}

std::string rope_scaling_text(const kernels::RopeScaling& s) { return rope_scaling_config(s).dump(); }

kernels::RopeScaling parse_rope_scaling(const std::string& text, const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_null()) return {};
  WEFT_CHECK(j.is_object(), "transformer: {}: rope scaling must be a JSON object or null, got {}", where, text);
  return rope_scaling_of(ConfigReader{j, where}, std::numeric_limits<int64_t>::max());
}

}  // namespace weft::apps
