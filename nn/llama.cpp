#include "nn/llama.h"

#include <cmath>

#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "nn/init.h"

namespace weft::nn {

void check_llama_config(const LlamaConfig& c) {
  WEFT_CHECK(c.vocab_size >= 1, "Llama: vocab_size must be >= 1, got {}", c.vocab_size);
  WEFT_CHECK(c.ctx >= 1, "Llama: ctx must be >= 1, got {}", c.ctx);
  WEFT_CHECK(c.n_layer >= 1, "Llama: n_layer must be >= 1, got {}", c.n_layer);
  WEFT_CHECK(c.n_head >= 1, "Llama: n_head must be >= 1, got {}", c.n_head);
  WEFT_CHECK(c.d_model >= 1, "Llama: d_model must be >= 1, got {}", c.d_model);
  WEFT_CHECK(c.n_kv_head >= 0 && c.n_head % c.kv_heads() == 0,
             "Llama: n_kv_head {} must divide n_head {} (each key/value head serves n_head / n_kv_head query heads)",
             c.n_kv_head, c.n_head);
  WEFT_CHECK(c.head_dim > 0 || c.d_model % c.n_head == 0,
             "Llama: n_head {} does not divide d_model {} (each head gets d_model / n_head channels)", c.n_head,
             c.d_model);
  WEFT_CHECK(c.head_dim >= 0 && c.head_size() % 2 == 0,
             "Llama: the head dim {} must be even (rotary embeddings turn channel pairs)", c.head_size());
  WEFT_CHECK(c.ffn_dim >= 0, "Llama: ffn_dim must be non-negative (0: the default), got {}", c.ffn_dim);
  WEFT_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 0, "Llama: rope_theta must be positive, got {}",
             c.rope_theta);
  kernels::check_rope_scaling("Llama", c.rope_scaling);
  WEFT_CHECK(c.rope_scaling.kind != kernels::RopeScaling::Kind::dynamic || c.ctx <= c.rope_scaling.original_context,
             "Llama: ctx {} is past max_position_embeddings {}, where dynamic rope scaling changes every frequency "
             "with the sequence's length (weft supports it up to max_position_embeddings)", c.ctx,
             c.rope_scaling.original_context);
  WEFT_CHECK(std::isfinite(c.norm_eps) && c.norm_eps > 0, "Llama: norm_eps must be positive, got {}", c.norm_eps);
  WEFT_CHECK(c.dropout >= 0 && c.dropout < 1, "Llama: dropout must be in [0, 1), got {}", c.dropout);
}

LlamaAttention::LlamaAttention(const LlamaConfig& cfg)
    : Module("LlamaAttention"), n_head(cfg.n_head), n_kv_head(cfg.kv_heads()), head_dim(cfg.head_size()),
      rope_theta(cfg.rope_theta), dropout_p(cfg.dropout), rope_scaling(cfg.rope_scaling) {
  check_llama_config(cfg);
  q_proj = register_module("q_proj", std::make_shared<Linear>(cfg.d_model, n_head * head_dim, cfg.qkv_bias));
  k_proj = register_module("k_proj", std::make_shared<Linear>(cfg.d_model, n_kv_head * head_dim, cfg.qkv_bias));
  v_proj = register_module("v_proj", std::make_shared<Linear>(cfg.d_model, n_kv_head * head_dim, cfg.qkv_bias));
  o_proj = register_module("o_proj", std::make_shared<Linear>(n_head * head_dim, cfg.d_model, false));
}

std::array<Tensor, 3> LlamaAttention::heads(const Tensor& x) {
  WEFT_CHECK(x.dim() == 3 && x.size(2) == q_proj->in_features, "LlamaAttention: expected input [B, T, {}], got {}",
             q_proj->in_features, tensor_desc(x));
  const int64_t B = x.size(0), T = x.size(1);
  // Head views of the projections, read in place by the fused kernel: [B, T, H*hd] as
  // [B, H, T, hd]; rotation and head grouping happen inside it.
  auto view = [&](const Tensor& y, int64_t h) { return y.view({B, T, h, head_dim}).transpose(1, 2); };
  return {view((*q_proj)(x), n_head), view((*k_proj)(x), n_kv_head), view((*v_proj)(x), n_kv_head)};
}

Tensor LlamaAttention::forward(const Tensor& x) {
  const std::array<Tensor, 3> qkv = heads(x);
  const Tensor &q = qkv[0], &k = qkv[1], &v = qkv[2];  // not a structured binding: a lambda reads them
  const AttentionOptions o{.causal = true, .dropout_p = dropout_p, .training = is_training(),
                           .rope = {.theta = rope_theta, .scaling = rope_scaling}, .dropout_block = dropout_block};
  Tensor y = documents_ ? attend_per_document(*documents_, 2, [&](int64_t b, int64_t begin, int64_t n) {
    auto part = [&](const Tensor& t) { return t.narrow(0, b, 1).narrow(2, begin, n); };
    return scaled_dot_product_attention(part(q), part(k), part(v), o);  // rotated from position 0
  }) : scaled_dot_product_attention(q, k, v, o);
  // The output is stored [B, T, H, hd]: the transpose back is a view.
  return (*o_proj)(y.transpose(1, 2).reshape({x.size(0), x.size(1), n_head * head_dim}));
}

Tensor LlamaAttention::forward_cached(const Tensor& x, LayerCache& cache) {
  auto [q, k, v] = heads(x);
  return (*o_proj)(attend_cached(q, k, v, cache, {.theta = rope_theta, .scaling = rope_scaling}));
}

std::string LlamaAttention::extra_repr() const {
  std::string scaling;
  if (rope_scaling.kind != kernels::RopeScaling::Kind::none)
    scaling = fmt::format(", rope_scaling={} x{}", kernels::rope_scaling_name(rope_scaling.kind), rope_scaling.factor);
  return fmt::format("n_head={}, n_kv_head={}, head_dim={}, rope_theta={}{}", n_head, n_kv_head, head_dim, rope_theta,
                     scaling);
}

SwiGLU::SwiGLU(int64_t d_model, int64_t ffn_dim) : Module("SwiGLU") {
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(d_model, ffn_dim, false));
  up_proj = register_module("up_proj", std::make_shared<Linear>(d_model, ffn_dim, false));
  down_proj = register_module("down_proj", std::make_shared<Linear>(ffn_dim, d_model, false));
}

Tensor SwiGLU::forward(const Tensor& x) { return (*down_proj)(swiglu((*gate_proj)(x), (*up_proj)(x))); }

LlamaBlock::Parts LlamaBlock::make_parts(const LlamaConfig& cfg, std::shared_ptr<LlamaAttention> attention) {
  check_llama_config(cfg);
  Parts p;
  p.input_layernorm = std::make_shared<RMSNorm>(cfg.d_model, cfg.norm_eps);
  p.self_attn = attention ? attention : std::make_shared<LlamaAttention>(cfg);
  p.post_attention_layernorm = std::make_shared<RMSNorm>(cfg.d_model, cfg.norm_eps);
  p.mlp = std::make_shared<SwiGLU>(cfg.d_model, cfg.ffn());
  return p;
}

LlamaBlock::LlamaBlock(const LlamaConfig& cfg, std::shared_ptr<LlamaAttention> attention)
    : LlamaBlock(make_parts(cfg, std::move(attention))) {}

LlamaBlock::LlamaBlock(Parts p)
    : PreNormBlock("LlamaBlock", {"input_layernorm", p.input_layernorm}, {"self_attn", p.self_attn},
                   {"post_attention_layernorm", p.post_attention_layernorm}, {"mlp", p.mlp}),
      input_layernorm(p.input_layernorm), post_attention_layernorm(p.post_attention_layernorm),
      self_attn(p.self_attn), mlp(p.mlp) {}

Llama::Llama(const LlamaConfig& c, const BlockMaker& make_block) : Module("Llama"), cfg(c) {
  check_llama_config(cfg);
  model = register_module("model", std::make_shared<Module>("LlamaModel"));
  embed_tokens = model->register_module("embed_tokens", std::make_shared<Embedding>(cfg.vocab_size, cfg.d_model));
  layers = model->register_module("layers", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.push_back(make_block ? make_block(cfg) : std::make_shared<LlamaBlock>(cfg));
    layers->push_back(blocks.back());
  }
  norm = model->register_module("norm", std::make_shared<RMSNorm>(cfg.d_model, cfg.norm_eps));
  if (!cfg.tie_weights)
    lm_head = register_module("lm_head", std::make_shared<Linear>(cfg.d_model, cfg.vocab_size, false));
}

Tensor Llama::forward(const Tensor& idx) {
  for (auto& block : blocks) block->self_attn->set_documents(nullptr);
  WEFT_CHECK(idx.dim() == 2, "Llama: expected token ids [B, T], got {}", tensor_desc(idx));
  WEFT_CHECK(idx.size(1) <= cfg.ctx, "Llama: sequence of {} tokens is longer than the context {}", idx.size(1),
             cfg.ctx);
  Tensor x = (*embed_tokens)(idx);
  for (auto& block : blocks) x = (*block)(x);
  return logits(x);
}

TensorList Llama::forward(const TensorList& in) {
  if (in.size() == 1) return {forward(in[0])};  // a call with the ids alone
  WEFT_CHECK(in.size() == 2 && in[1].shape() == in[0].shape(), "Llama: expected token ids and their positions, two "
             "[B, T] tensors, got {} tensor(s){}", in.size(), in.size() == 2 ? ": " + tensor_desc(in[1]) : "");
  WEFT_CHECK(in[0].size(1) <= cfg.ctx, "Llama: {} tokens are longer than the context {}", in[0].size(1), cfg.ctx);
  auto documents = Documents::from_positions(in[1]);
  Tensor x = (*embed_tokens)(in[0]);
  for (auto& block : blocks) block->self_attn->set_documents(documents);
  for (auto& block : blocks) x = (*block)(x);
  return {logits(x)};
}

Tensor Llama::hidden_cached(const Tensor& idx, KVCache& cache) {
  Tensor x = (*embed_tokens)(idx);
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward_cached(x, cache.layer(int64_t(i)));
  return x;
}

Tensor Llama::logits(const Tensor& h) {
  Tensor x = (*norm)(h);
  if (lm_head) return (*lm_head)(x);
  return linear(x, embed_tokens->weight);  // tied head: the weight gradient straight into its dtype
}

std::string Llama::extra_repr() const {
  return fmt::format("n_layer={}, n_head={}, n_kv_head={}, d_model={}, ffn_dim={}, ctx={}, vocab={}, tied={}",
                     cfg.n_layer, cfg.n_head, cfg.kv_heads(), cfg.d_model, cfg.ffn(), cfg.ctx, cfg.vocab_size,
                     cfg.tie_weights);
}

void init_llama(Llama& m) {
  NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * double(m.cfg.n_layer));
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    if (name.ends_with("norm.weight")) init::ones_(t);  // the RMSNorms: input_layernorm, ..., model.norm
    else if (name.ends_with(".bias")) init::zeros_(t);
    else if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) init::normal_(t, 0.0, residual_std);
    else init::normal_(t, 0.0, 0.02);
  }
}

}  // namespace weft::nn
