// kernels/cpu: the fused attention loops behind kernels/attention.h. Callers have checked shapes, dtypes (any float
// dtype; 16-bit ones other than bf16 on the bf16 tiles are computed in f32 copies) and devices; every tensor is a 4-D
// [B, H, T, C] view with a unit last stride and any other strides (k, v with Hkv heads dividing H), lse [B, H, Tq]
// contiguous, rope tables (if on) of lse's dtype (f32 for 16-bit q) covering every position used.
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
// Whether q and v (head dims multiples of 16) take register-tiled loops: f32 on CPUs with AVX-512 while the AVX-512
// GEMM kernel is in use; bf16 where the bf16 GEMM kernel is (gemm.h: bf16_gemm_native), else where f32 does.
bool attention_uses_tiles(const Tensor& q, const Tensor& v);

}  // namespace weft::kernels::cpu
