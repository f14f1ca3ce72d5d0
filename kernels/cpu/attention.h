// kernels/cpu: the fused attention loops behind kernels/attention.h. Callers have checked
// shapes, dtypes (f32 or f64 here) and devices; every tensor is a 4-D [B, H, T, C] view with
// a unit last stride and any other strides (k, v with Hkv heads dividing H), lse [B, H, Tq]
// contiguous, rope tables (if on) of q's dtype covering every position used.
#pragma once
#include "core/tensor.h"
#include "kernels/rope.h"

namespace weft::kernels::cpu {

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
               const AttentionRope& rope, const Tensor& out, const Tensor& lse);
// dq, dk, dv are overwritten.
void attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, const AttentionRope& rope, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv);
// Whether q and v (f32, head dims multiples of 16) take the register-tiled AVX-512 loops: on
// CPUs with AVX-512 while the AVX-512 GEMM kernel is in use (gemm.h, WEFT_CPU_GEMM).
bool attention_uses_tiles(const Tensor& q, const Tensor& v);

}  // namespace weft::kernels::cpu
