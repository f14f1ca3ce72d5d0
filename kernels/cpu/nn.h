// kernels/cpu: the CPU loops behind kernels/nn.h. Callers (kernels/nn.cpp) have checked shapes, dtypes and devices and
// allocated the outputs; inputs named "contiguous" here are. Index bounds are checked in these functions (before any
// parallel loop) because only they read the index values.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/elementwise.h"  // kParallelGrain
#include "kernels/dropout_mask.h"
#include "kernels/nn.h"
#include "kernels/optim.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace weft::kernels::cpu {

inline int thread_count() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
inline int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// softmax / log_softmax of x (contiguous) seen as [outer, n, inner], reducing over n.
void softmax(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log);
// grad, y contiguous; y is the forward's output.
void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                      int64_t inner, bool log);

// x contiguous [rows, n]; weight/bias contiguous [n] or undefined; mean/rstd [rows].
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                const Tensor& mean, const Tensor& rstd);
// dweight/dbias undefined when not wanted.
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

// Throws naming `op` if an element of index (i64/i32) lies outside [0, size).
// The message reads "<op>: index <v> is out of range for <size> <what>".
void check_index_range(const Tensor& index, int64_t size, const char* op, const std::string& what);
// weight contiguous [V, D]; out [..., D].
void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out);
// grad contiguous [..., D]; out zeroed [V, D].
void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& out);
// x contiguous; index contiguous 1-D; out contiguous.
void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
// out zeroed, contiguous; src contiguous.
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
// x any strides; index contiguous with x's ndim; out contiguous, index's shape.
void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
// out (a copy of self) contiguous; index contiguous; src any strides.
void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

// logits contiguous [N, C]; target contiguous [N]; loss [N] (none) or 0-dim; row_stats [N, 2].
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                   Reduction reduction, const Tensor& loss, const Tensor& row_stats);
void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats,
                            const Tensor& target, int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits);

// Inputs already checked to fit `out` (contiguous) along dim; any dtypes and strides.
void cat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out);

// x, y contiguous; mask bool. The mask depends only on `seed` and the element position.
void dropout(const Tensor& x, double p, uint64_t seed, const DropoutIndex& at, const Tensor& y, const Tensor& mask);
void dropout_backward(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx);

// NCHW, everything contiguous; bias may be undefined. 16-bit types are computed in f32 by the caller.
void conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out);
void conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
// x contiguous [planes, H, W]; out/indices [planes, Ho, Wo].
void max_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices);
// grad/indices contiguous [planes, Ho, Wo]; dx zeroed [planes, H, W]. Range-checks indices.
void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx);

// Fused optimizer updates (kernels/cpu/optim.cpp): in place, contiguous, f32 or f64 (others throw).
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s);
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& s);

}  // namespace weft::kernels::cpu
