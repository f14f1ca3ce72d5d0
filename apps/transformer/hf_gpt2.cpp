// gpt2: GPT2LMHeadModel (apps/transformer/gpt.h), weft's GPT-2.
#include "apps/transformer/hf_family.h"

namespace weft::apps {

ModelConfig read_gpt2_config(const ConfigReader& r) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = r.integer("vocab_size");
  c.ctx = r.integer("n_positions");
  c.d_model = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.ffn_dim = r.integer("n_inner", 0);
  c.dropout = r.number("resid_pdrop", 0.0);  // what an export writes back (a run trains with its --dropout)
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

nlohmann::json write_gpt2_config(const ModelConfig& c) {
  using nlohmann::json;
  return {{"vocab_size", c.vocab_size},
          {"n_positions", c.ctx}, {"n_ctx", c.ctx}, {"n_embd", c.d_model}, {"n_layer", c.n_layer},
          {"n_head", c.n_head}, {"n_inner", c.ffn_dim > 0 ? json(c.ffn_dim) : json(nullptr)},
          {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}, {"resid_pdrop", c.dropout},
          {"embd_pdrop", c.dropout}, {"attn_pdrop", c.dropout}, {"scale_attn_weights", true},
          {"tie_word_embeddings", c.tie_weights}, {"torch_dtype", "float32"}, {"use_cache", true}};
}

}  // namespace weft::apps
