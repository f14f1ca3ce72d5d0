// autograd: scaled-dot-product attention as one graph node over the fused kernel (kernels/attention.h): the node saves
// q, k, v, the output and one log-sum-exp per query row, never the [B, H, Tq, Tk] probabilities. With dropout on the
// probabilities (p > 0 while training) the fused kernel does not apply: the op is then computed from the composite ops
// (rotary_embedding, repeated key/value heads, matmul, masked_fill, softmax, dropout, matmul), which are correct but
// keep the full score tensor.
#include <cmath>
#include <limits>

#include "autograd/autocast.h"
#include "autograd/kept_outputs.h"
#include "autograd/ops.h"
#include "kernels/attention.h"

namespace weft {

using autograd::needs_grad;
using autograd::record;
using autograd::TensorList;

namespace {

void check_dropout(double p, const char* op) {
  WEFT_CHECK(p >= 0 && p <= 1, "{}: dropout probability must be in [0, 1], got {}", op, p);
}

// [B, T, 3, H, hd] -> the i-th of the three [B, H, T, hd] views (query, key, value).
Tensor qkv_heads(const Tensor& x, int64_t i) { return x.select(2, i).transpose(1, 2); }

double default_scale(const Tensor& q) { return 1.0 / std::sqrt(double(std::max<int64_t>(q.size(-1), 1))); }

// [B, Hkv, T, C] -> [B, Hkv * G, T, C], each head repeated G times in place (head h of the
// result is head h / G of x), as the fused kernel reads them.
Tensor repeat_heads(const Tensor& x, int64_t G) {
  if (G == 1) return x;
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), C = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, G, T, C}).reshape({B, Hkv * G, T, C});
}

// softmax(q k^T * scale, masked) with dropout, then @ v, from differentiable ops.
Tensor composite_attention(const Tensor& q_, const Tensor& k_, const Tensor& v_, const AttentionOptions& o) {
  const int64_t G = q_.size(1) / k_.size(1);
  Tensor q = o.rope.on() ? rotary_embedding(q_, o.rope.theta, o.rope.q_pos, o.rope.scaling) : q_;
  Tensor k = repeat_heads(o.rope.on() ? rotary_embedding(k_, o.rope.theta, o.rope.k_pos, o.rope.scaling) : k_, G);
  Tensor v = repeat_heads(v_, G);
  Tensor att = matmul(q, k.transpose(-2, -1)) * default_scale(q);
  if (o.causal) {
    const int64_t tq = q.size(-2), tk = k.size(-2);
    Tensor rows = arange(0, double(tq), 1, {.dtype = DType::i64, .device = q.device()}).view({tq, 1});
    Tensor cols = arange(0, double(tk), 1, {.dtype = DType::i64, .device = q.device()}).view({1, tk});
    att = masked_fill(att, cols > rows, -std::numeric_limits<double>::infinity());
  }
  return matmul(dropout(softmax(att, -1), o.dropout_p, true, o.gen, o.dropout_block), v);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double dropout_p, bool training, Generator* gen) {
  return scaled_dot_product_attention(
      q, k, v, AttentionOptions{.causal = causal, .dropout_p = dropout_p, .training = training, .gen = gen});
}

Tensor scaled_dot_product_attention(const Tensor& q_, const Tensor& k_, const Tensor& v_, const AttentionOptions& o) {
  const char* op = "scaled_dot_product_attention";
  check_dropout(o.dropout_p, op);
  WEFT_CHECK(q_.defined() && k_.defined() && v_.defined(), "{}: query, key and value must be defined tensors", op);
  const Tensor q = autocast_input(q_), k = autocast_input(k_), v = autocast_input(v_);
  kernels::check_attention(op, q, k, v, o.causal, o.rope);
  if (o.training && o.dropout_p > 0) return composite_attention(q, k, v, o);
  const double scale = default_scale(q);
  const TensorList kept = autograd::kept_op("attention", [&] {
    auto [out, lse] = kernels::attention(q, k, v, o.causal, scale, o.rope);
    return TensorList{out, lse};
  });
  const Tensor &out = kept[0], &lse = kept[1];
  if (needs_grad({&q, &k, &v})) {
    record("ScaledDotProductAttentionBackward", {q, k, v}, {out},
           [q = q.detach(), k = k.detach(), v = v.detach(), out = out.detach(), lse = lse, causal = o.causal,
            scale, rope = o.rope](const TensorList& g) -> TensorList {
             auto [dq, dk, dv] = kernels::attention_backward(g[0], q, k, v, out, lse, causal, scale, rope);
             return {dq, dk, dv};
           })->reads_outputs({out});
  }
  return out;
}

Tensor rotary_embedding(const Tensor& x, double theta, int64_t pos0, const kernels::RopeScaling& scaling) {
  const char* op = "rotary_embedding";
  WEFT_CHECK(x.defined() && x.dim() >= 2, "{}: expected [..., T, E], got {}", op,
             x.defined() ? tensor_desc(x) : std::string("undefined"));
  WEFT_CHECK(is_floating(x.dtype()), "{}: expected a float tensor, got {}", op, tensor_desc(x));
  const int64_t T = x.size(-2), E = x.size(-1), half = E / 2;
  kernels::check_rope(op, {.theta = theta, .scaling = scaling, .q_pos = pos0, .k_pos = pos0}, E, pos0 + T);
  const DType table_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  auto tables = kernels::rope_tables(theta, E, pos0 + T, table_dtype, x.device(), scaling);
  Tensor c = tables.cos.narrow(0, pos0, T).to(x.dtype()), s = tables.sin.narrow(0, pos0, T).to(x.dtype());
  Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

Tensor scaled_dot_product_attention_qkv(const Tensor& qkv_, int64_t n_head, bool causal, double dropout_p,
                                        bool training, Generator* gen, const kernels::RandomBlock& dropout_block) {
  const char* op = "scaled_dot_product_attention_qkv";
  check_dropout(dropout_p, op);
  WEFT_CHECK(qkv_.defined() && qkv_.dim() == 3, "{}: qkv must be [batch, seq, 3 * d_model], got {}", op,
             qkv_.defined() ? tensor_desc(qkv_) : std::string("undefined"));
  const Tensor qkv = autocast_input(qkv_);
  WEFT_CHECK(n_head > 0 && qkv.size(2) % (3 * n_head) == 0,
             "{}: the last dim of qkv {} must split into 3 x n_head {} equal heads", op, tensor_desc(qkv), n_head);
  const int64_t B = qkv.size(0), T = qkv.size(1), d = qkv.size(2) / 3, hd = d / n_head;
  if (training && dropout_p > 0) {
    Tensor x = qkv.reshape({B, T, 3, n_head, hd});
    Tensor y = scaled_dot_product_attention(qkv_heads(x, 0), qkv_heads(x, 1), qkv_heads(x, 2),
                                            {causal, dropout_p, training, gen, {}, dropout_block});
    return y.transpose(1, 2).reshape({B, T, d});
  }
  Tensor x = qkv.detach().reshape({B, T, 3, n_head, hd});  // a view of a Linear's output
  const double scale = 1.0 / std::sqrt(double(std::max<int64_t>(hd, 1)));
  const TensorList kept = autograd::kept_op("attention", [&] {
    auto [out, lse] = kernels::attention(qkv_heads(x, 0), qkv_heads(x, 1), qkv_heads(x, 2), causal, scale);
    return TensorList{out, lse};
  });
  const Tensor &out = kept[0], &lse = kept[1];
  Tensor y = out.transpose(1, 2).view({B, T, d});  // out is stored [B, T, H, hd]
  if (needs_grad({&qkv})) {
    record("ScaledDotProductAttentionQkvBackward", {qkv}, {y},
           [x, out = out, lse = lse, causal, scale, B, T, d, n_head, hd](const TensorList& g) -> TensorList {
             Tensor grad = g[0].reshape({B, T, n_head, hd}).transpose(1, 2);
             // One [B, T, 3d] gradient buffer: the three head gradients are written straight
             // into their slices, so no zero-filled copies are summed afterwards.
             Tensor dqkv = empty({B, T, 3 * d}, {.dtype = x.dtype(), .device = x.device()});
             Tensor dx = dqkv.view({B, T, 3, n_head, hd});
             kernels::attention_backward_into(grad, qkv_heads(x, 0), qkv_heads(x, 1), qkv_heads(x, 2), out, lse,
                                              causal, scale, qkv_heads(dx, 0), qkv_heads(dx, 1), qkv_heads(dx, 2));
             return {dqkv};
           })->reads_outputs({out});
  }
  return y;
}

}  // namespace weft
