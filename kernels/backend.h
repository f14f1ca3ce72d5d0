// kernels: KernelBackend, the table of op entry points one device type fills and registers,
// through which every public kernel entry point (kernels/*.cpp) dispatches.
//
// The entry points check arguments, allocate outputs and prepare inputs (dtype conversion, broadcasting as stride-0
// views, contiguous copies where an entry below says so) in one way valid for every device; a backend function then
// only runs the loop. Where a device needs more (the CPU computes 16-bit attention in f32, CUDA copies indices to the
// host to range-check them), that stays inside its own backend function.
//
// The CPU table (kernels/cpu/backend.cpp) is always there. Other device types register theirs from the static
// initialisers of their backend library (cuda/register.cpp), which kernel_backend() loads on first use.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../core/tensor.h"
#include "nn.h"
#include "op_kinds.h"
#include "optim.h"
#include "rope.h"

namespace weft::kernels {

struct DropoutIndex;  // kernels/dropout_mask.h
// Every member must be set. All tensors are on the backend's device; shapes, dtypes and
// devices have been checked by the caller and outputs allocated there.
struct KernelBackend {
  // ---- element-wise (kernels/elementwise.h). Inputs are broadcast to the output's shape
  // (stride-0 views, any strides) and already in the dtype the op computes in.
  void (*unary)(UnaryOp op, const Tensor& out, const Tensor& x);
  // Only the tensor the derivative reads (x or y) is defined.
  void (*unary_backward)(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y);
  void (*binary)(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
  void (*binary_scalar)(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
  // SwiGLU's backward (kernels/elementwise.h), all five tensors contiguous, of one shape and dtype.
  void (*swiglu_backward)(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                          const Tensor& dup);
  void (*add_)(const Tensor& dst, const Tensor& src, double alpha);
  void (*mul_scalar_)(const Tensor& dst, double s);
  void (*where)(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
  void (*masked_fill)(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
  void (*clamp)(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi);

  // ---- reductions (kernels/reduce.h): x's memory is contiguous from its data pointer and reads as [outer, reduced,
  // inner, inner_reduced]; dims 1 and 3 are reduced into the contiguous [outer, inner] output.
  void (*reduce)(ReduceOp op, const Tensor& out, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
                 int64_t inner_reduced);
  // Values (x's dtype) and i64 indices of the max (or min) over [outer, reduced, inner]; reduced > 0.
  void (*arg_reduce)(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x, int64_t outer,
                     int64_t reduced, int64_t inner);

  // ---- linear algebra (kernels/linalg.h): any float dtype, any strides in; out contiguous.
  // a [..., m, k] @ b [..., k, n], batch dims broadcast to out's [batch..., m, n].
  void (*matmul)(const Tensor& a, const Tensor& b, const Tensor& out);
  void (*dot)(const Tensor& a, const Tensor& b, const Tensor& out);                              // 1-D, out 0-dim
  // 2-D; bias (beta 0 then) a contiguous [n] of out's dtype, or undefined. a_sums, a contiguous
  // [m] of a's dtype or undefined, may receive the sums of a's rows: returns whether it did.
  bool (*gemm)(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, const Tensor& bias,
               const Tensor& a_sums);

  // ---- nn (kernels/nn.h); tensors named "contiguous" are.
  // x, y, grad contiguous [outer, n, inner], reducing over n.
  void (*softmax)(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log);
  void (*softmax_backward)(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                           int64_t inner, bool log);
  // x contiguous [rows, n]; weight/bias contiguous [n] or undefined; mean/rstd [rows] f32 (f64 for f64); dweight/dbias
  // undefined when not wanted. An undefined mean is RMS norm: nothing is subtracted (mu = 0) and bias is undefined.
  void (*layer_norm)(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                     const Tensor& mean, const Tensor& rstd);
  void (*layer_norm_backward)(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
  // logits contiguous [N, C]; target contiguous [N] (range-checked by the backend); loss [N]
  // (Reduction::none) or 0-dim; row_stats [N, 2]: each row's max and log(sum e^(x - max)), from
  // which the backward makes the log-probabilities again. loss, row_stats and grad_loss are f32
  // for 16-bit logits, else of the logits' dtype; dlogits is of the logits' dtype.
  void (*cross_entropy)(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                        Reduction reduction, const Tensor& loss, const Tensor& row_stats);
  void (*cross_entropy_backward)(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats,
                                 const Tensor& target, int64_t ignore_index, double label_smoothing,
                                 Reduction reduction, const Tensor& dlogits);
  // Inputs fit `out` (contiguous) along dim; any dtypes and strides.
  void (*cat)(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out);
  // x, y contiguous; mask bool, element i's dropout_keep(seed, threshold, at.whole(i)) (kernels/dropout_mask.h).
  void (*dropout)(const Tensor& x, double p, uint64_t seed, const DropoutIndex& at, const Tensor& y, const Tensor& mask);
  void (*dropout_backward)(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx);
  // NCHW f32/f64, contiguous; bias may be undefined; dx zeroed.
  void (*conv2d)(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p,
                 const Tensor& out);
  void (*conv2d_backward)(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                          const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
  // x contiguous [planes, H, W]; out/indices [planes, Ho, Wo]; non-empty.
  void (*max_pool2d)(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices);
  // grad/indices contiguous [planes, Ho, Wo]; dx zeroed [planes, H, W]; non-empty.
  void (*max_pool2d_backward)(const Tensor& grad, const Tensor& indices, const Tensor& dx);

  // ---- embedding and index ops (kernels/nn.h); index tensors contiguous i64/i32.
  // Throws "<op>: index <v> is out of range for <size> <what>" for an index outside [0, size).
  void (*check_index_range)(const Tensor& index, int64_t size, const char* op, const std::string& what);
  // The rest get range-checked indices. weight contiguous [V, D]; out [..., D].
  void (*embedding)(const Tensor& weight, const Tensor& indices, const Tensor& out);
  // grad contiguous [..., D]; out zeroed [V, D].
  void (*embedding_backward)(const Tensor& grad, const Tensor& indices, const Tensor& out);
  // x contiguous; index 1-D; out contiguous.
  void (*index_select)(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
  // out zeroed, contiguous; src contiguous.
  void (*index_add)(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
  // x any strides; index with x's ndim; out contiguous, index's shape.
  void (*gather)(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
  // out (a copy of self) contiguous; src any strides.
  void (*scatter_add)(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

  // ---- fused attention (kernels/attention.h): [B, H, T, C] views with unit last stride, any other strides, any float
  // dtype, k and v with H / G heads for some G (query head h reads key head h / G); lse [B, H, Tq] contiguous f32 (f64
  // for f64), rope tables of lse's dtype. dq, dk, dv are overwritten.
  void (*attention)(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                    const AttentionRope& rope, const Tensor& out, const Tensor& lse);
  void (*attention_backward)(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& out, const Tensor& lse, bool causal, double scale,
                             const AttentionRope& rope, const Tensor& dq, const Tensor& dk, const Tensor& dv);

  // ---- fused optimizer updates (kernels/optim.h): in place, contiguous, same shape, dtype
  // and device; the backend rejects dtypes other than f32/f64.
  void (*adam_step_)(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                     const AdamStep& s);
  void (*sgd_step_)(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& s);
};

// Installs `table` (which must outlive the program) for a device type; a later call replaces an earlier one. Called by
// backends at start-up. [Note: backend registration] in core/device_runtime.h.
void register_kernel_backend(DeviceType type, const KernelBackend* table);

// The table for `device`, loading its backend library on first use. Throws weft::Error naming `op`, the device and the
// reason when no backend provides kernels for its type, or when the device index does not exist.
const KernelBackend& kernel_backend(Device device, const char* op);

namespace cpu {
// The CPU's table (kernels/cpu/backend.cpp), usable before any static initialiser has run.
const KernelBackend& kernel_table();
}  // namespace cpu
// `base`'s entries for `device`, each a span of the op profiler named for a call of `op`
// (kernels/timed_backend.cpp), for its rows or a step trace (on cuda: the op's device time).
const KernelBackend& timed_kernel_table(const char* op, Device device, const KernelBackend& base);

namespace meta {
// The meta device's (kernels/meta/backend.cpp): every entry does nothing (shape propagation).
const KernelBackend& kernel_table();
}  // namespace meta

}  // namespace weft::kernels
