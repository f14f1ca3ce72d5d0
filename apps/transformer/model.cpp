#include "apps/transformer/model.h"

#include <unistd.h>

#include "apps/transformer/gpt.h"
#include "core/fill_rule.h"

namespace weft::apps {

nn::LlamaConfig llama_config(const ModelConfig& c) {
  return {.vocab_size = c.vocab_size, .ctx = c.ctx, .n_layer = c.n_layer, .n_head = c.n_head,
          .n_kv_head = c.n_kv_head, .d_model = c.d_model, .head_dim = c.head_dim, .ffn_dim = c.ffn_dim,
          .rope_theta = c.rope_theta, .rope_scaling = c.rope_scaling, .norm_eps = c.norm_eps, .dropout = c.dropout,
          .tie_weights = c.tie_weights, .qkv_bias = c.qkv_bias};
}

void check_config(const ModelConfig& cfg) {
  WEFT_CHECK(cfg.arch == "gpt2" || cfg.arch == "llama", "transformer: --arch must be gpt2 or llama, got \"{}\"",
             cfg.arch);
  WEFT_CHECK(cfg.n_layer > 0, "transformer: --n-layer must be positive, got {}", cfg.n_layer);
  WEFT_CHECK(cfg.n_head > 0, "transformer: --n-head must be positive, got {}", cfg.n_head);
  WEFT_CHECK(cfg.d_model > 0, "transformer: --d-model must be positive, got {}", cfg.d_model);
  WEFT_CHECK(cfg.head_dim > 0 || cfg.d_model % cfg.n_head == 0,
             "transformer: --n-head {} does not divide --d-model {} (each head gets d_model / n_head channels)",
             cfg.n_head, cfg.d_model);
  WEFT_CHECK(cfg.ctx > 0, "transformer: --ctx must be positive, got {}", cfg.ctx);
  WEFT_CHECK(cfg.vocab_size > 0, "transformer: vocabulary size must be positive, got {}", cfg.vocab_size);
  WEFT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "transformer: --dropout must be in [0, 1), got {}", cfg.dropout);
  WEFT_CHECK(cfg.n_layer <= kMaxLayers, "transformer: --n-layer must be at most {}, got {}", kMaxLayers, cfg.n_layer);
  WEFT_CHECK(cfg.n_head <= kMaxHeads, "transformer: --n-head must be at most {}, got {}", kMaxHeads, cfg.n_head);
  WEFT_CHECK(cfg.d_model <= kMaxDModel, "transformer: --d-model must be at most {}, got {}", kMaxDModel, cfg.d_model);
  WEFT_CHECK(cfg.ctx <= kMaxCtx, "transformer: --ctx must be at most {}, got {}", kMaxCtx, cfg.ctx);
  WEFT_CHECK(cfg.vocab_size <= kMaxVocab, "transformer: vocabulary size must be at most {}, got {}", kMaxVocab,
             cfg.vocab_size);
  WEFT_CHECK(cfg.ffn_dim >= 0 && cfg.ffn_dim <= 16 * kMaxDModel, "transformer: --ffn-dim must be in [0, {}], got {}",
             16 * kMaxDModel, cfg.ffn_dim);
  // A family's structure (weft computes it; an export names the family): GPT-2's is gpt2, Qwen2 alone has q/k/v biases
  // and Qwen3 alone q/k norms.
  WEFT_CHECK(cfg.family.empty() || ((cfg.family == "gpt2") == (cfg.arch == "gpt2") && cfg.qkv_bias == (cfg.family ==
             "qwen2") && cfg.qk_norm == (cfg.family == "qwen3")), "transformer: family {} is not a model of arch {}{}{}",
             cfg.family, cfg.arch, cfg.qkv_bias ? " with q/k/v biases" : "", cfg.qk_norm ? " with q/k norms" : "");
  if (cfg.arch == "gpt2") {
    WEFT_CHECK(cfg.n_kv_head == 0 || cfg.n_kv_head == cfg.n_head,
               "transformer: --n-kv-head is for --arch llama (GPT-2 has one key/value head per query head)");
    WEFT_CHECK(cfg.head_dim == 0 || cfg.head_dim * cfg.n_head == cfg.d_model,
               "transformer: GPT-2 heads have d_model / n_head channels, not {}", cfg.head_dim);
    WEFT_CHECK(cfg.rope_scaling.kind == kernels::RopeScaling::Kind::none && !cfg.qkv_bias && !cfg.qk_norm &&
                   cfg.sliding_window == 0,
               "transformer: rope scaling, q/k/v biases and a sliding window are for --arch llama");
  } else {
    WEFT_CHECK(cfg.n_kv_head >= 0 && cfg.n_kv_head <= cfg.n_head && (cfg.n_kv_head == 0 || cfg.n_head % cfg.n_kv_head == 0),
               "transformer: --n-kv-head {} must divide --n-head {} (each key/value head serves n_head / n_kv_head "
               "query heads)", cfg.n_kv_head, cfg.n_head);
    nn::check_llama_config(llama_config(cfg));
    WEFT_CHECK(cfg.sliding_window == 0 || cfg.ctx <= cfg.sliding_window,
               "transformer: --ctx {} is past the model's sliding_window {}: weft computes full attention, which is "
               "that model's only within the window", cfg.ctx, cfg.sliding_window);
  }
}

void check_fits_host(const ModelConfig& cfg) {
  const double params = param_count(cfg), bytes = 4 * params;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);  // this machine's memory, 0 if unknown
  const double mem = pages > 0 && page > 0 ? double(pages) * double(page) : 0;
  WEFT_CHECK(mem == 0 || bytes <= mem,
             "transformer: a model of --n-layer {} --n-head {} --d-model {} --ctx {} has {:.3g} parameters: its "
             "float32 weights alone need {:.1f} GiB, more than this machine's {:.1f} GiB of memory",
             cfg.n_layer, cfg.n_head, cfg.d_model, cfg.ctx, params, bytes / double(1 << 30), mem / double(1 << 30));
}

double param_count(const ModelConfig& cfg) {
  const double d = double(cfg.d_model), V = double(cfg.vocab_size), L = double(cfg.n_layer);
  double total = 0;
  if (cfg.arch == "llama") {
    const nn::LlamaConfig lc = llama_config(cfg);
    const double q = double(cfg.n_head * lc.head_size()), kv = double(lc.kv_heads() * lc.head_size());
    const double block = d * q + 2 * d * kv + q * d + 3 * d * double(lc.ffn()) + 2 * d + (cfg.qkv_bias ? q + 2 * kv : 0) +
                         (cfg.qk_norm ? 2 * double(lc.head_size()) : 0);
    total = L * block + V * d + d;
  } else {
    const double ffn = double(cfg.ffn_dim > 0 ? cfg.ffn_dim : 4 * cfg.d_model);
    // Per block: ln_1, ln_2 (2d each), qkv (3d^2 + 3d), proj (d^2 + d), mlp (2 d ffn + ffn + d).
    const double block = 4 * d * d + 2 * d * ffn + ffn + 9 * d;
    total = L * block + (V + double(cfg.ctx)) * d + 2 * d;
  }
  if (!cfg.tie_weights) total += V * d;
  return total;
}

LanguageModel make_model(const ModelConfig& cfg) {
  check_config(cfg);
  LanguageModel m{cfg, nullptr, {}};
  if (cfg.arch == "llama") {
    auto llama = cfg.qk_norm ? std::make_shared<nn::Qwen3>(llama_config(cfg))
                             : std::make_shared<nn::Llama>(llama_config(cfg));
    m.blocks.assign(llama->blocks.begin(), llama->blocks.end());
    m.module = llama;
  } else {
    auto gpt = std::make_shared<GPT>(cfg);
    m.blocks.assign(gpt->blocks.begin(), gpt->blocks.end());
    m.module = gpt;
  }
  return m;
}

void init_model(const LanguageModel& m) {
  if (auto* llama = dynamic_cast<nn::Llama*>(m.module.get())) return nn::init_llama(*llama);
  init_gpt(dynamic_cast<GPT&>(*m.module));
}

LanguageModel make_model_to_load(const ModelConfig& cfg) {
  DefaultDeviceGuard meta(Device::meta());
  LanguageModel m = make_model(cfg);
  const auto none = std::make_shared<const FillRule>(FillRule{.kind = FillRule::Kind::none});
  for (auto& [name, p] : m.module->named_parameters()) p.storage()->set_deferred_fill(none);
  return m;
}

std::string embedding_name(const ModelConfig& cfg) {
  return cfg.arch == "llama" ? "model.embed_tokens.weight" : "transformer.wte.weight";
}

}  // namespace weft::apps
