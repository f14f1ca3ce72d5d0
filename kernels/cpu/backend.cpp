// kernels/cpu: the CPU's KernelBackend table (kernels/backend.h), filled with the loops of kernels/cpu/*.cpp.
#include "kernels/backend.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nn.h"
#include "kernels/cpu/reduce.h"

namespace weft::kernels::cpu {

const KernelBackend& kernel_table() {
  static const KernelBackend table{
      .unary = &unary,
      .unary_backward = &unary_backward,
      .binary = &binary,
      .binary_scalar = &binary_scalar,
      .swiglu_backward = &swiglu_backward,
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
      .attention = &attention,
      .attention_backward = &attention_backward,
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
