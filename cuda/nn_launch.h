// cuda/: the launch functions of the nn, optimizer and attention kernels (softmax.cu,
// layer_norm.cu, cross_entropy.cu, dropout.cu, conv.cu, optim.cu, attention.cu), called by
// nn_ops.cpp. Like launch.h, free of core/tensor.h so nvcc can compile it: tensors arrive as
// device pointers plus a dtype, contiguous unless strides are given. Floating dtypes are f32,
// f64, bf16 and f16; 16-bit ones are read and written in their type and computed in f32.
// Each function queues its kernels on `stream`, checks the launch and returns.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/dropout_mask.h"

namespace weft::kernels::cuda {

// ---- softmax.cu: x, y, grad, dx contiguous [outer, n, inner], reducing over n.
void launch_softmax(const void* x, void* y, DType dtype, int64_t outer, int64_t n, int64_t inner, bool log,
                    cudaStream_t stream);
// y is the forward's output.
void launch_softmax_backward(const void* grad, const void* y, void* dx, DType dtype, int64_t outer, int64_t n,
                             int64_t inner, bool log, cudaStream_t stream);

// ---- layer_norm.cu: x, y [rows, n]; weight, bias [n] or null; mean, rstd [rows] of the
// statistics type (f64 for f64 inputs, else f32); mean null: RMS norm (bias null too).
void launch_layer_norm(const void* x, const void* weight, const void* bias, DType dtype, int64_t rows, int64_t n,
                       double eps, void* y, void* mean, void* rstd, cudaStream_t stream);
// dweight / dbias null when not wanted; weight null when the forward had none.
void launch_layer_norm_backward(const void* grad, const void* x, const void* mean, const void* rstd,
                                const void* weight, DType dtype, int64_t rows, int64_t n, void* dx, void* dweight,
                                void* dbias, cudaStream_t stream);

// ---- cross_entropy.cu: logits [n, c] of `dtype`; target [n] (i64 or i32, already checked to
// be in range or ignore_index). reduction: 0 none (loss [n]), 1 mean, 2 sum (loss 0-dim);
// `count` is the number of non-ignored targets (used by mean). row_loss: scratch of n doubles.
// loss, row_stats [n, 2] and grad_loss in the arithmetic type (f32 for 16-bit logits).
void launch_cross_entropy(const void* logits, const void* target, DType target_dtype, DType dtype, int64_t n,
                          int64_t c, int64_t ignore_index, double label_smoothing, int reduction, int64_t count,
                          void* loss, void* row_stats, double* row_loss, cudaStream_t stream);
// grad_loss [n] (none) or one element; dlogits [n, c] of `dtype`.
void launch_cross_entropy_backward(const void* grad_loss, const void* logits, const void* row_stats, const void* target,
                                   DType target_dtype, DType dtype, int64_t n, int64_t c, int64_t ignore_index,
                                   double label_smoothing, int reduction, int64_t count, void* dlogits,
                                   cudaStream_t stream);

// ---- dropout.cu: mask bool. The keep decision of element i is the CPU's (kernels/dropout_mask.h),
// so the mask equals the CPU's for the same seed.
void launch_dropout(const void* x, DType dtype, int64_t numel, double p, uint64_t seed, const DropoutIndex& at, void* y,
                    bool* mask, cudaStream_t stream);
void launch_dropout_backward(const void* grad, const bool* mask, DType dtype, int64_t numel, double p, void* dx,
                             cudaStream_t stream);

// ---- conv.cu: NCHW images, f32 or f64 (16-bit is converted by kernels/nn_conv.cpp).
struct ConvShape {
  int64_t c, h, w;          // one input image
  int64_t kh, kw, ho, wo;   // kernel and output plane
  int64_t sh, sw, ph, pw;   // stride and padding
};
// col[i][(c*kh + ki)*kw + kj][oh*wo + ow] = x[i][c][oh*sh - ph + ki][ow*sw - pw + kj] (0 outside)
// for `images` consecutive images.
void launch_im2col(const void* x, DType dtype, const ConvShape& s, int64_t images, void* col, cudaStream_t stream);
// The adjoint: dx[i][c][ih][iw] = sum of the col entries im2col read it into (overwrites dx).
void launch_col2im(const void* col, DType dtype, const ConvShape& s, int64_t images, void* dx, cudaStream_t stream);
// out[i][o][j] += bias[o] for out [images, channels, plane].
void launch_add_channel_bias(void* out, const void* bias, DType dtype, int64_t images, int64_t channels,
                             int64_t plane, cudaStream_t stream);
// dbias[o] = sum over i, j of grad[i][o][j].
void launch_channel_sum(const void* grad, void* dbias, DType dtype, int64_t images, int64_t channels,
                        int64_t plane, cudaStream_t stream);
// x [planes, h, w] -> out, indices (i64, flat in the plane) [planes, ho, wo]; any float dtype.
void launch_max_pool2d(const void* x, DType dtype, int64_t planes, int64_t h, int64_t w, int64_t ho, int64_t wo,
                       int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, void* out,
                       int64_t* indices, cudaStream_t stream);
// dx [planes, h, w] (zeroed by the caller) += grad at each index (f32 or f64: 16-bit grads
// are accumulated by the caller in an f32 buffer). Overlapping windows add atomically, so the
// low bits may vary between runs when stride < kernel; indices outside the plane are skipped.
void launch_max_pool2d_backward(const void* grad, const int64_t* indices, DType grad_dtype, int64_t planes,
                                int64_t plane_in, int64_t plane_out, void* dx, DType dx_dtype, cudaStream_t stream);

// ---- optim.cu: in place over n contiguous elements, f32 or f64, with kernels/cpu/optim.cpp's
// operations in its order and rounding (no contraction into FMAs beyond the ones it makes).
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  bool decoupled;
  double grad_scale;
};
void launch_adam_step(void* param, const void* grad, void* exp_avg, void* exp_avg_sq, DType dtype, int64_t n,
                      const AdamArgs& a, cudaStream_t stream);
struct SgdArgs {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first;
  double grad_scale;
};
// momentum_buf may be null when momentum == 0.
void launch_sgd_step(void* param, const void* grad, void* momentum_buf, DType dtype, int64_t n, const SgdArgs& a,
                     cudaStream_t stream);

// ---- attention.cu: [B, H, T, C] operands given by pointer and strides (in elements) of
// dims 0..2, the last dim unit-stride; lse [B, H, Tq] contiguous, f32 (f64 for f64).
struct HeadsView {
  void* data;
  int64_t sb, sh, st;
};
struct AttentionShape {
  int64_t B, H, Hkv, Tq, Tk, E, Ev;  // Hkv divides H: query head h reads key/value head h / (H / Hkv)
  bool causal;
  double scale;
  // Rotary tables [positions, E/2] of the arithmetic type (kernels/rope.h) and the positions of
  // the first query and key rows; null: no rotation.
  const void* rope_cos = nullptr;
  const void* rope_sin = nullptr;
  int64_t q_pos = 0, k_pos = 0;
};
void launch_attention(const HeadsView& q, const HeadsView& k, const HeadsView& v, const HeadsView& out, void* lse,
                      DType dtype, const AttentionShape& s, cudaStream_t stream);
// delta: scratch of B*H*Tq values of lse's type. dq, dk, dv are overwritten.
void launch_attention_backward(const HeadsView& grad, const HeadsView& q, const HeadsView& k, const HeadsView& v,
                               const HeadsView& out, const void* lse, void* delta, const HeadsView& dq,
                               const HeadsView& dk, const HeadsView& dv, DType dtype, const AttentionShape& s,
                               cudaStream_t stream);

}  // namespace weft::kernels::cuda
