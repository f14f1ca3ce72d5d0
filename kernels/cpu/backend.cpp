// kernels/cpu: the CPU's KernelBackend table (kernels/backend.h), filled with the loops of
// kernels/cpu/*.cpp, plus the 16-bit round trip of attention that only the CPU needs.
#include "kernels/backend.h"

#include "core/copy.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/reduce.h"

namespace weft::kernels::cpu {
namespace {

Tensor f32(const Tensor& t) { return t.to(DType::f32); }
// An f32 [B, H, T, C] tensor stored as [B, T, H, C], the layout the entry points allocate.
Tensor empty_bthc_f32(const Tensor& like) {
  return empty({like.size(0), like.size(2), like.size(1), like.size(3)}).transpose(1, 2);
}

// The attention loops take f32 and f64: 16-bit operands are computed in f32 copies.
void attention_any(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                   const AttentionRope& rope, const Tensor& out, const Tensor& lse) {
  if (!is_16bit(q.dtype())) return attention(q, k, v, causal, scale, rope, out, lse);
  Tensor out32 = empty_bthc_f32(out);
  attention(f32(q), f32(k), f32(v), causal, scale, rope, out32, lse);
  copy_elements(out, out32);
}

void attention_backward_any(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& out, const Tensor& lse, bool causal, double scale,
                            const AttentionRope& rope, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  if (!is_16bit(q.dtype())) return attention_backward(grad, q, k, v, out, lse, causal, scale, rope, dq, dk, dv);
  Tensor dq32 = empty_bthc_f32(dq), dk32 = empty_bthc_f32(dk), dv32 = empty_bthc_f32(dv);
  attention_backward(f32(grad), f32(q), f32(k), f32(v), f32(out), lse, causal, scale, rope, dq32, dk32, dv32);
  copy_elements(dq, dq32);
  copy_elements(dk, dk32);
  copy_elements(dv, dv32);
}

}  // namespace

const KernelBackend& kernel_table() {
  static const KernelBackend table{
      .unary = &unary,
      .unary_backward = &unary_backward,
      .binary = &binary,
      .binary_scalar = &binary_scalar,
      .add_ = &add_,
      .mul_scalar_ = &mul_scalar_,
      .where = &where,
      .masked_fill = &masked_fill,
      .clamp = &clamp,
      .reduce = &reduce,
      .arg_reduce = &arg_reduce,
      .matmul = &matmul,
      .dot = &dot,
      .gemm = &gemm,
      .softmax = &softmax,
      .softmax_backward = &softmax_backward,
      .layer_norm = &layer_norm,
      .layer_norm_backward = &layer_norm_backward,
      .cross_entropy = &cross_entropy,
      .cross_entropy_backward = &cross_entropy_backward,
      .cat = &cat,
      .dropout = &dropout,
      .dropout_backward = &dropout_backward,
      .conv2d = &conv2d,
      .conv2d_backward = &conv2d_backward,
      .max_pool2d = &max_pool2d,
      .max_pool2d_backward = &max_pool2d_backward,
      .check_index_range = &check_index_range,
      .embedding = &embedding,
      .embedding_backward = &embedding_backward,
      .index_select = &index_select,
      .index_add = &index_add,
      .gather = &gather,
      .scatter_add = &scatter_add,
      .attention = &attention_any,
      .attention_backward = &attention_backward_any,
      .adam_step_ = &adam_step_,
      .sgd_step_ = &sgd_step_,
  };
  return table;
}

namespace {
// Registered like any other backend, so that the registry lists every device type's table;
// kernel_backend() itself returns kernel_table() for the CPU without waiting for this.
const bool g_registered = [] {
  register_kernel_backend(DeviceType::cpu, &kernel_table());
  return true;
}();
}  // namespace

}  // namespace weft::kernels::cpu
