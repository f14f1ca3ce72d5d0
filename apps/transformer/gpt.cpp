#include "apps/transformer/gpt.h"

#include <cmath>

namespace weft::apps {

GPT::GPT(const ModelConfig& c) : nn::Module("GPT"), cfg(c) {
  check_config(cfg);
  transformer = register_module("transformer", std::make_shared<nn::Module>("Transformer"));
  wte = transformer->register_module("wte", std::make_shared<nn::Embedding>(cfg.vocab_size, cfg.d_model));
  wpe = transformer->register_module("wpe", std::make_shared<nn::Embedding>(cfg.ctx, cfg.d_model));
  h = transformer->register_module("h", std::make_shared<nn::ModuleList>());
  nn::TransformerConfig tc{.d_model = cfg.d_model, .n_head = cfg.n_head, .dropout = cfg.dropout, .bias = true,
                           .gelu_approximate = "tanh", .ffn_dim = cfg.ffn_dim};
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.push_back(std::make_shared<nn::Block>(tc));
    h->push_back(blocks.back());
  }
  ln_f = transformer->register_module("ln_f", std::make_shared<nn::LayerNorm>(cfg.d_model));
  if (!cfg.tie_weights)
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(cfg.d_model, cfg.vocab_size, false));
}

Tensor GPT::forward(const Tensor& idx) {
  WEFT_CHECK(idx.dim() == 2, "GPT: expected token ids [B, T], got {}", tensor_desc(idx));
  WEFT_CHECK(idx.size(1) <= cfg.ctx, "GPT: sequence of {} tokens is longer than the context {}", idx.size(1), cfg.ctx);
  for (auto& block : blocks) block->attn->set_documents(nullptr);
  Tensor x = embed(idx, 0);
  for (auto& block : blocks) x = (*block)(x);
  return logits(x);
}

nn::TensorList GPT::forward(const nn::TensorList& in) {
  if (in.size() == 1) return {forward(in[0])};  // a call with the ids alone
  WEFT_CHECK(in.size() == 2 && in[0].dim() == 2 && in[1].shape() == in[0].shape(), "GPT: expected token ids and their "
             "positions, two [B, T] tensors, got {} tensor(s)", in.size());
  WEFT_CHECK(in[0].size(1) <= cfg.ctx, "GPT: sequence of {} tokens is longer than the context {}", in[0].size(1), cfg.ctx);
  auto documents = nn::Documents::from_positions(in[1]);
  for (auto& block : blocks) block->attn->set_documents(documents);
  Tensor x = embed(in[0], in[1]);
  for (auto& block : blocks) x = (*block)(x);
  return {logits(x)};
}

Tensor GPT::hidden_cached(const Tensor& idx, nn::KVCache& cache) {
  Tensor x = embed(idx, cache.length());
  for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward_cached(x, cache.layer(int64_t(i)));
  return x;
}

Tensor GPT::embed(const Tensor& idx, int64_t pos0) {
  // Positions on the device of the token ids (where the model computes): an embedding needs
  // its indices on its weight's device.
  return embed(idx, arange(double(pos0), double(pos0 + idx.size(1)), 1, {.dtype = kInt64, .device = idx.device()}));
}

Tensor GPT::embed(const Tensor& idx, const Tensor& pos) {
  return dropout((*wte)(idx) + (*wpe)(pos), cfg.dropout, is_training());  // [B, T, d] + [T, d] or [B, T, d]
}

Tensor GPT::logits(const Tensor& h) {
  Tensor x = (*ln_f)(h);
  if (lm_head) return (*lm_head)(x);
  return linear(x, wte->weight);  // tied head, no bias: the weight gradient straight into its dtype
}

std::string GPT::extra_repr() const {
  return fmt::format("n_layer={}, n_head={}, d_model={}, ctx={}, vocab={}, tied={}", cfg.n_layer, cfg.n_head,
                     cfg.d_model, cfg.ctx, cfg.vocab_size, cfg.tie_weights);
}

void init_gpt(GPT& model) {
  NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * double(model.cfg.n_layer));
  for (auto& [name, p] : model.named_parameters()) {
    Tensor t = p;
    if (name.find(".ln_") != std::string::npos) continue;  // LayerNorm keeps (1, 0)
    if (name.ends_with(".bias")) nn::init::zeros_(t);
    else if (name.ends_with("c_proj.weight")) nn::init::normal_(t, 0.0, residual_std);
    else nn::init::normal_(t, 0.0, 0.02);
  }
}

}  // namespace weft::apps
