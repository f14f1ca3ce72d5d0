// kernels: entry points of the fused attention (kernels/attention.h): argument checks that name the operand at fault,
// output allocation in the [B, T, H, hd] layout, and the dispatch to the device's backend (the CPU's computes 16-bit
// operands in f32 copies, kernels/cpu/backend.cpp). The CPU loops are in kernels/cpu/attention.cpp.
#include "kernels/attention.h"

#include <algorithm>

#include "kernels/backend.h"
#include "kernels/nn_checks.h"

namespace weft::kernels {
using namespace checks;
namespace {

// Sizes of the three operands once checked.
struct Dims {
  int64_t B, H, Hkv, Tq, Tk, E, Ev;
};

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Rope& rope) {
  check_float(op, q, "query");
  check_float(op, k, "key");
  check_float(op, v, "value");
  check_device(op, q, k);
  check_device(op, q, v);
  WEFT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(),
             "{}: query, key and value must share a dtype, got {}, {} and {}", op, tensor_desc(q), tensor_desc(k),
             tensor_desc(v));
  WEFT_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "{}: query, key and value must be 4-D [batch, heads, seq, head_dim], got {}, {} and {}", op,
             tensor_desc(q), tensor_desc(k), tensor_desc(v));
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  WEFT_CHECK(k.size(0) == d.B && v.size(0) == d.B, "{}: batch dims differ: query {}, key {}, value {}", op,
             tensor_desc(q), tensor_desc(k), tensor_desc(v));
  WEFT_CHECK(v.size(1) == d.Hkv && d.Hkv >= 1 && d.H % d.Hkv == 0,
             "{}: key and value need the same number of heads, dividing the query's: query {}, key {}, value {}",
             op, tensor_desc(q), tensor_desc(k), tensor_desc(v));
  WEFT_CHECK(k.size(3) == d.E, "{}: query {} and key {} must have the same head_dim (last dim)", op,
             tensor_desc(q), tensor_desc(k));
  WEFT_CHECK(v.size(2) == d.Tk, "{}: key {} and value {} must have the same sequence length (dim 2)", op,
             tensor_desc(k), tensor_desc(v));
  WEFT_CHECK(!causal || d.Tq == d.Tk,
             "{}: causal attention needs as many queries as keys, got query {} and key {}", op, tensor_desc(q),
             tensor_desc(k));
  WEFT_CHECK(d.Tk > 0 || d.Tq == 0 || d.B * d.H == 0,
             "{}: key {} has no positions to attend to", op, tensor_desc(k));
  if (rope.on()) check_rope(op, rope, d.E, std::max(rope.q_pos + d.Tq, rope.k_pos + d.Tk));
  return d;
}

// Strided views are read in place when their rows are unit-stride; others are copied.
Tensor rows(const Tensor& t) { return t.stride(-1) == 1 || t.size(-1) <= 1 ? t : t.contiguous(); }

AttentionRope tables_for(const Rope& rope, const Dims& d, const Tensor& q) {
  if (!rope.on()) return {};
  const int64_t n_pos = std::max(rope.q_pos + d.Tq, rope.k_pos + d.Tk);
  return {rope_tables(rope.theta, d.E, n_pos, stats_dtype(q.dtype()), q.device(), rope.scaling), rope.q_pos,
          rope.k_pos};
}

// A [B, H, T, C] tensor stored as [B, T, H, C].
Tensor empty_bthc(int64_t B, int64_t H, int64_t T, int64_t C, TensorOptions opts) {
  return empty({B, T, H, C}, opts).transpose(1, 2);
}

void check_grads_into(const char* op, const Tensor& g, const Tensor& like_t, const char* name) {
  WEFT_CHECK(g.defined() && g.dtype() == like_t.dtype() && g.shape() == like_t.shape() &&
                 g.device() == like_t.device() && (g.stride(-1) == 1 || g.size(-1) <= 1),
             "{}: {} {} must match {} with unit last stride", op, name, tensor_desc(g), tensor_desc(like_t));
}

}  // namespace

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                     const Rope& rope) {
  check_qkv(op, q, k, v, causal, rope);
}

std::pair<Tensor, Tensor> attention(const Tensor& q_, const Tensor& k_, const Tensor& v_, bool causal,
                                    double scale, const Rope& rope) {
  const char* op = "attention";
  Tensor q = plain(q_), k = plain(k_), v = plain(v_);
  Dims d = check_qkv(op, q, k, v, causal, rope);
  const KernelBackend& backend = kernel_backend(q.device(), op);
  Tensor out = empty_bthc(d.B, d.H, d.Tq, d.Ev, like(q));
  Tensor lse = empty({d.B, d.H, d.Tq}, {.dtype = stats_dtype(q.dtype()), .device = q.device()});
  if (out.numel() == 0 && lse.numel() == 0) return {out, lse};
  backend.attention(rows(q), rows(k), rows(v), causal, scale, tables_for(rope, d, q), out, lse);
  return {out, lse};
}

void attention_backward_into(const Tensor& grad_, const Tensor& q_, const Tensor& k_, const Tensor& v_,
                             const Tensor& out_, const Tensor& lse_, bool causal, double scale, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv, const Rope& rope) {
  const char* op = "attention_backward";
  Tensor grad = plain(grad_), q = plain(q_), k = plain(k_), v = plain(v_), out = plain(out_),
         lse = plain(lse_);
  Dims d = check_qkv(op, q, k, v, causal, rope);
  Shape out_shape{d.B, d.H, d.Tq, d.Ev};
  for (const Tensor* t : {&grad, &out}) {
    WEFT_CHECK(t->defined() && t->dtype() == q.dtype() && t->shape() == out_shape,
               "{}: grad and out must be {}{} like the forward's output, got {}", op, dtype_name(q.dtype()),
               shape_str(out_shape), t->defined() ? tensor_desc(*t) : std::string("undefined"));
    check_device(op, q, *t);
  }
  WEFT_CHECK(lse.defined() && lse.dtype() == stats_dtype(q.dtype()) && lse.shape() == Shape({d.B, d.H, d.Tq}),
             "{}: saved log-sum-exp {} does not fit query {} (want {}{})", op,
             lse.defined() ? tensor_desc(lse) : std::string("undefined"), tensor_desc(q),
             dtype_name(stats_dtype(q.dtype())), shape_str({d.B, d.H, d.Tq}));
  check_device(op, q, lse);
  check_grads_into(op, dq, q, "dq");
  check_grads_into(op, dk, k, "dk");
  check_grads_into(op, dv, v, "dv");
  const KernelBackend& backend = kernel_backend(q.device(), op);
  if (d.B * d.H == 0 || (d.Tq == 0 && d.Tk == 0)) return;
  backend.attention_backward(rows(grad), rows(q), rows(k), rows(v), rows(out), lse.contiguous(), causal, scale,
                             tables_for(rope, d, q), dq, dk, dv);
}

std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out, const Tensor& lse,
                                                      bool causal, double scale, const Rope& rope) {
  // Shapes are checked again by attention_backward_into; these only need to be allocatable.
  WEFT_CHECK(q.defined() && k.defined() && v.defined() && q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "attention_backward: query, key and value must be 4-D [batch, heads, seq, head_dim], got {}, {} and "
             "{}", q.defined() ? tensor_desc(q) : "undefined", k.defined() ? tensor_desc(k) : "undefined",
             v.defined() ? tensor_desc(v) : "undefined");
  auto alloc = [](const Tensor& t) { return empty_bthc(t.size(0), t.size(1), t.size(2), t.size(3), like(t)); };
  Tensor dq = alloc(q), dk = alloc(k), dv = alloc(v);
  attention_backward_into(grad, q, k, v, out, lse, causal, scale, dq, dk, dv, rope);
  return {dq, dk, dv};
}

}  // namespace weft::kernels
