// kernels: fused scaled-dot-product attention, forward and backward, on [B, H, T, hd] operands. One call computes
// softmax(q k^T * scale (+ causal mask)) v without a [B, H, Tq, Tk] score tensor: each (batch, head) pair works through
// blocks of query rows against the keys they may see, and the backward recomputes those scores from the saved per-row
// log-sum-exp instead of keeping them.
//
// Grouped-query attention: k and v may have fewer heads than q (Hkv dividing H); query head h reads key/value head h /
// (H / Hkv) in place, with no repeated copies. Rotary embeddings (kernels/rope.h) are applied to q and k as the kernels
// read them, so no rotated copy of either exists outside a thread's working buffers.
#pragma once
#include <tuple>
#include <utility>

#include "../core/tensor.h"
#include "rope.h"

namespace weft::kernels {

// Throws a weft::Error naming `op` and the operand at fault unless q, k, v (and rope) fit the rules of attention below.
void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                     const Rope& rope = {});

// q [B, H, Tq, E], k [B, Hkv, Tk, E], v [B, Hkv, Tk, Ev]; any strides whose last one is 1 are read in place (the heads
// of a fused qkv projection need no copy). causal masks key j > query i and needs Tq == Tk. f32 and f64 are computed in
// their own type, bf16/f16 in f32. Returns (out, lse): out [B, H, Tq, Ev] in the inputs' dtype, stored as [B, Tq, H,
// Ev] (so out.transpose(1, 2) is contiguous: the layout the output projection reads), and lse [B, H, Tq], the
// log-sum-exp of each scaled score row (f32, f64 for f64 inputs), which the backward needs. rope rotates q and k first
// (rope.on()).
std::pair<Tensor, Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double scale, const Rope& rope = {});

// Gradients of attention for the forward above: returns (dq, dk, dv) shaped like q, k, v
// and stored [B, T, H, hd] like out.
std::tuple<Tensor, Tensor, Tensor> attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                      const Tensor& v, const Tensor& out, const Tensor& lse,
                                                      bool causal, double scale, const Rope& rope = {});

// The same backward writing into caller-provided dq, dk, dv (shaped like q, k, v, last stride 1, any other strides, not
// overlapping each other), e.g. the three head views of one [B, T, 3d] gradient buffer.
void attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, bool causal, double scale, const Tensor& dq,
                             const Tensor& dk, const Tensor& dv, const Rope& rope = {});

}  // namespace weft::kernels
