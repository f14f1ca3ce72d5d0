// kernels/meta: the meta device's KernelBackend table, for shape propagation. The public entry
// points have checked their arguments and allocated the outputs (meta tensors: shapes, dtypes
// and strides, bytes counted by the meta allocator, no memory) before they dispatch, so every
// entry here has nothing left to do. Used only inside a MetaComputeGuard (core/device.h).
#include "kernels/backend.h"

namespace weft::kernels::meta {
namespace {

// Converts to a function pointer of any signature returning void: a function that does nothing.
struct Nothing {
  template <class... A>
  using Fn = void (*)(A...);
  template <class... A>
  operator Fn<A...>() const {
    return [](A...) {};
  }
};

KernelBackend make_table() {
  KernelBackend t{};
  const Nothing none;
  t.unary = none;
  t.unary_backward = none;
  t.binary = none;
  t.binary_scalar = none;
  t.swiglu_backward = none;
  t.add_ = none;
  t.mul_scalar_ = none;
  t.where = none;
  t.masked_fill = none;
  t.clamp = none;
  t.reduce = none;
  t.arg_reduce = none;
  t.matmul = none;
  t.dot = none;
  t.gemm = [](const Tensor&, const Tensor&, const Tensor&, double, double, const Tensor&, const Tensor&) {
    return true;  // a_sums "written": a meta tensor has nothing to write
  };
  t.softmax = none;
  t.softmax_backward = none;
  t.layer_norm = none;
  t.layer_norm_backward = none;
  t.cross_entropy = none;
  t.cross_entropy_backward = none;
  t.cat = none;
  t.dropout = none;
  t.dropout_backward = none;
  t.conv2d = none;
  t.conv2d_backward = none;
  t.max_pool2d = none;
  t.max_pool2d_backward = none;
  t.check_index_range = none;
  t.embedding = none;
  t.embedding_backward = none;
  t.index_select = none;
  t.index_add = none;
  t.gather = none;
  t.scatter_add = none;
  t.attention = none;
  t.attention_backward = none;
  t.adam_step_ = none;
  t.sgd_step_ = none;
  return t;
}

}  // namespace

const KernelBackend& kernel_table() {
  static const KernelBackend table = make_table();
  return table;
}

}  // namespace weft::kernels::meta
