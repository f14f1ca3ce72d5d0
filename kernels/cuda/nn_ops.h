// kernels/cuda: the backend functions behind kernels/nn.h (softmax, layer norm, cross-entropy,
// dropout, conv2d, max pooling), kernels/optim.h (fused Adam/AdamW and SGD) and
// kernels/attention.h, with the contracts of their kernels/cpu counterparts (kernels/cpu/nn.h,
// kernels/cpu/optim.cpp, kernels/cpu/attention.h): the public entry points have checked the
// arguments, allocated the outputs and made the inputs contiguous where those say so. Each
// runs on the current stream of the tensors' device and returns without waiting, except
// where noted. The kernels are in the .cu files named in nn_launch.h; docs/CUDA.md describes
// them.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "kernels/nn.h"
#include "kernels/optim.h"

namespace weft::kernels::cuda {

// ---- softmax family: x, y, grad contiguous [outer, n, inner]; any float dtype.
void softmax(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log);
void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                      int64_t inner, bool log);

// ---- layer norm: x contiguous [rows, n] (any leading shape); weight/bias contiguous [n] or
// undefined; mean/rstd [rows] f32 (f64 for f64).
void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                const Tensor& mean, const Tensor& rstd);
void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias);

// ---- cross-entropy: logits contiguous [N, C], target contiguous [N]. The targets are copied
// to the host to be checked (as on the CPU, an out-of-range target is an error) and counted,
// so these wait for the stream.
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                   Reduction reduction, const Tensor& loss, const Tensor& log_probs);
void cross_entropy_backward(const Tensor& grad_loss, const Tensor& log_probs, const Tensor& target,
                            int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits);

// ---- dropout: x, y contiguous; mask bool. The same mask as the CPU for the same seed.
void dropout(const Tensor& x, double p, uint64_t seed, const Tensor& y, const Tensor& mask);
void dropout_backward(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx);

// ---- conv2d (f32/f64, NCHW, contiguous) as im2col + cuBLASLt GEMMs; max pooling any float.
void conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out);
void conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias);
// x contiguous [planes, H, W]; out/indices [planes, Ho, Wo].
void max_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices);
// grad/indices contiguous [planes, Ho, Wo]; dx zeroed [planes, H, W]. An index outside the
// plane (never produced by max_pool2d) is skipped rather than checked, to spare a copy to the host.
void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx);

// ---- fused optimizer updates (checked by kernels/cpu/optim.cpp's entry points): in place,
// contiguous, f32 or f64, bit-identical to the CPU update on the same inputs.
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s);
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& s);

// ---- fused attention: [B, H, T, C] views with unit last stride, any other strides; any
// float dtype (16-bit computed in f32); lse [B, H, Tq] contiguous f32 (f64 for f64).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, const Tensor& out,
               const Tensor& lse);
// dq, dk, dv are overwritten.
void attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv);

}  // namespace weft::kernels::cuda
