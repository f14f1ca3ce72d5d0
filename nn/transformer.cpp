#include "nn/transformer.h"

#include "autograd/ops.h"

namespace weft::nn {

namespace {
// Checked by every layer that takes a TransformerConfig, before any parameter is allocated.
const TransformerConfig& checked(const TransformerConfig& cfg, const char* layer) {
  WEFT_CHECK(cfg.d_model >= 1, "{}: d_model must be >= 1, got {}", layer, cfg.d_model);
  WEFT_CHECK(cfg.n_head >= 1, "{}: n_head must be >= 1, got {}", layer, cfg.n_head);
  WEFT_CHECK(cfg.d_model % cfg.n_head == 0, "{}: d_model {} must be divisible by n_head {}", layer, cfg.d_model,
             cfg.n_head);
  WEFT_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "{}: dropout must be in [0, 1), got {}", layer, cfg.dropout);
  WEFT_CHECK(cfg.gelu_approximate == "tanh" || cfg.gelu_approximate == "none",
             "{}: gelu_approximate must be \"tanh\" or \"none\", got \"{}\"", layer, cfg.gelu_approximate);
  WEFT_CHECK(cfg.ffn_dim >= 0, "{}: ffn_dim must be non-negative (0: 4 * d_model), got {}", layer, cfg.ffn_dim);
  return cfg;
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const TransformerConfig& cfg, Generator* gen)
    : Module("CausalSelfAttention"), d_model(checked(cfg, "CausalSelfAttention").d_model), n_head(cfg.n_head), dropout_p(cfg.dropout) {
  WEFT_CHECK(n_head > 0 && d_model % n_head == 0, "CausalSelfAttention: d_model {} must be divisible by n_head {}",
             d_model, n_head);
  c_attn = register_module("c_attn", std::make_shared<Linear>(d_model, 3 * d_model, cfg.bias, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(d_model, d_model, cfg.bias, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  WEFT_CHECK(x.dim() == 3 && x.size(2) == d_model, "CausalSelfAttention: expected input [B, T, {}], got {}",
             d_model, tensor_desc(x));
  // One fused node reads the q, k, v heads straight out of the [B, T, 3d] projection and
  // returns the heads concatenated as [B, T, d]; the [B, H, T, T] scores are never stored.
  const Tensor qkv = (*c_attn)(x);
  auto attend = [&](const Tensor& part) {
    return scaled_dot_product_attention_qkv(part, n_head, /*causal=*/true, dropout_p, is_training(), nullptr, dropout_block);
  };
  Tensor y = documents_ ? attend_per_document(*documents_, 1, [&](int64_t b, int64_t begin, int64_t n) {
    return attend(qkv.narrow(0, b, 1).narrow(1, begin, n));
  }) : attend(qkv);
  return dropout((*c_proj)(y), dropout_p, is_training());
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, LayerCache& cache) {
  WEFT_CHECK(x.dim() == 3 && x.size(2) == d_model, "CausalSelfAttention: expected input [B, T, {}], got {}",
             d_model, tensor_desc(x));
  const int64_t B = x.size(0), T = x.size(1);
  // q, k, v as head views [B, H, T, hd] of the fused projection [B, T, 3, H, hd].
  Tensor qkv = (*c_attn)(x).view({B, T, 3, n_head, d_model / n_head});
  auto heads = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  return (*c_proj)(attend_cached(heads(0), heads(1), heads(2), cache));
}

std::string CausalSelfAttention::extra_repr() const { return fmt::format("d_model={}, n_head={}", d_model, n_head); }

MLP::MLP(const TransformerConfig& cfg, Generator* gen)
    : Module("MLP"), approximate(checked(cfg, "MLP").gelu_approximate), dropout_p(cfg.dropout) {
  const int64_t ffn = cfg.ffn_dim > 0 ? cfg.ffn_dim : 4 * cfg.d_model;
  c_fc = register_module("c_fc", std::make_shared<Linear>(cfg.d_model, ffn, cfg.bias, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(ffn, cfg.d_model, cfg.bias, gen));
}

Tensor MLP::forward(const Tensor& x) {
  return dropout((*c_proj)(gelu((*c_fc)(x), approximate)), dropout_p, is_training());
}

PreNormBlock::PreNormBlock(std::string type, std::pair<std::string, ModulePtr> norm_1,
                           std::pair<std::string, ModulePtr> attn, std::pair<std::string, ModulePtr> norm_2,
                           std::pair<std::string, ModulePtr> mlp)
    : Module(std::move(type)) {
  norm_1_ = register_module(norm_1.first, norm_1.second);
  attn_ = register_module(attn.first, attn.second);
  norm_2_ = register_module(norm_2.first, norm_2.second);
  mlp_ = register_module(mlp.first, mlp.second);
  cached_attn_ = dynamic_cast<CachedAttention*>(attn_.get());
}

Tensor PreNormBlock::forward(const Tensor& x) {
  Tensor h = x + (*attn_)((*norm_1_)(x));
  return h + (*mlp_)((*norm_2_)(h));
}

Tensor PreNormBlock::forward_cached(const Tensor& x, LayerCache& cache) {
  WEFT_CHECK(cached_attn_, "{}: its attention ({}) cannot decode with a key/value cache", type_name(),
             attn_->type_name());
  return call([&](const TensorList& in) -> TensorList {
    auto attend = [&](const TensorList& a) -> TensorList { return {cached_attn_->forward_cached(a[0], cache)}; };
    Tensor h = in[0] + attn_->call(attend, {(*norm_1_)(in[0])})[0];
    return {h + (*mlp_)((*norm_2_)(h))};
  }, {x})[0];
}

Block::Parts Block::make_parts(const TransformerConfig& cfg, Generator* gen) {
  checked(cfg, "Block");
  Parts p;  // built in order: a generator draws the attention's weights before the MLP's
  p.ln_1 = std::make_shared<LayerNorm>(cfg.d_model, 1e-5, true, cfg.bias);
  p.attn = std::make_shared<CausalSelfAttention>(cfg, gen);
  p.ln_2 = std::make_shared<LayerNorm>(cfg.d_model, 1e-5, true, cfg.bias);
  p.mlp = std::make_shared<MLP>(cfg, gen);
  return p;
}

Block::Block(const TransformerConfig& cfg, Generator* gen) : Block(make_parts(cfg, gen)) {}

Block::Block(Parts p)
    : PreNormBlock("Block", {"ln_1", p.ln_1}, {"attn", p.attn}, {"ln_2", p.ln_2}, {"mlp", p.mlp}),
      ln_1(p.ln_1), ln_2(p.ln_2), attn(p.attn), mlp(p.mlp) {}

}  // namespace weft::nn
