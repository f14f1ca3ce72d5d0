// cuda/: the CUDA backend functions of the nn, optimizer and attention ops (contracts in
// kernels/backend.h): tensors to kernel arguments, and the host side of convolution: im2col
// buffers in chunks of images, and the products through gemm_raw. The kernels are in the .cu
// files named in nn_launch.h; docs/CUDA.md describes them.
#include <algorithm>

#include "core/copy.h"
#include "cuda/gemm.h"
#include "cuda/nn_launch.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"

namespace weft::kernels::cuda {
namespace {

const void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
void* mut_ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Checks targets on the host (the CPU's rule and message) and counts the non-ignored ones.
int64_t check_and_count_targets(const Tensor& target, int64_t c, int64_t ignore_index) {
  Tensor host = target.to(Device::cpu()).to(DType::i64);
  const int64_t* pt = host.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < host.numel(); ++i) {
    int64_t t = pt[i];
    WEFT_CHECK(t == ignore_index || (t >= 0 && t < c),
               "cross_entropy: target {} (row {}) is out of range for {} classes (ignore_index {})", t, i, c,
               ignore_index);
    count += t != ignore_index;
  }
  return count;
}

int reduction_code(Reduction r) { return r == Reduction::none ? 0 : r == Reduction::mean ? 1 : 2; }

HeadsView heads(const Tensor& t) { return {t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)}; }

// Images per im2col buffer: the buffer stays under this many bytes (at least one image).
constexpr int64_t kColBufferBytes = int64_t(256) << 20;

struct ConvPlan {
  ConvShape s;
  int64_t n, o, k, hw, image;
  bool direct;  // 1x1, stride 1, no padding: the image is its own column matrix
  int64_t chunk;
};

ConvPlan conv_plan(const Tensor& x, const Tensor& weight, const Conv2dParams& p, const Tensor& out) {
  ConvPlan c;
  c.s = {x.size(1), x.size(2), x.size(3), weight.size(2), weight.size(3), out.size(2), out.size(3),
         p.stride_h, p.stride_w, p.pad_h, p.pad_w};
  c.n = x.size(0);
  c.o = weight.size(0);
  c.k = c.s.c * c.s.kh * c.s.kw;
  c.hw = c.s.ho * c.s.wo;
  c.image = c.s.c * c.s.h * c.s.w;
  c.direct = c.s.kh == 1 && c.s.kw == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 && p.pad_w == 0;
  const int64_t per_image = std::max<int64_t>(c.k * c.hw * int64_t(dtype_size(x.dtype())), 1);
  c.chunk = std::clamp<int64_t>(kColBufferBytes / per_image, 1, std::max<int64_t>(c.n, 1));
  return c;
}

char* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + elements * int64_t(dtype_size(t.dtype()));
}

// ---------------------------------------------------------------- softmax, layer norm

void softmax(const Tensor& x, const Tensor& y, int64_t outer, int64_t n, int64_t inner, bool log) {
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device().index);
  launch_softmax(x.data_ptr(), y.data_ptr(), x.dtype(), outer, n, inner, log, stream_of(x));
}

void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& dx, int64_t outer, int64_t n,
                      int64_t inner, bool log) {
  if (y.numel() == 0) return;
  DeviceGuard guard(y.device().index);
  launch_softmax_backward(grad.data_ptr(), y.data_ptr(), dx.data_ptr(), y.dtype(), outer, n, inner, log,
                          stream_of(y));
}

void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = rstd.numel(), n = rows ? x.numel() / rows : 0;
  if (rows == 0) return;
  DeviceGuard guard(x.device().index);
  launch_layer_norm(x.data_ptr(), ptr_or_null(weight), ptr_or_null(bias), x.dtype(), rows, n, eps, y.data_ptr(),
                    mut_ptr_or_null(mean), rstd.data_ptr(), stream_of(x));
}

void layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                         const Tensor& weight, const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  const int64_t rows = rstd.numel();
  // With no rows, n comes from the parameter gradients (which are then sums of nothing: 0).
  const int64_t n = rows ? x.numel() / rows
                         : dweight.defined() ? dweight.numel() : dbias.defined() ? dbias.numel() : 0;
  DeviceGuard guard(x.device().index);
  launch_layer_norm_backward(rows ? grad.data_ptr() : nullptr, rows ? x.data_ptr() : nullptr,
                             rows ? ptr_or_null(mean) : nullptr, rows ? rstd.data_ptr() : nullptr, ptr_or_null(weight),
                             x.dtype(), rows, n, rows ? dx.data_ptr() : nullptr, mut_ptr_or_null(dweight),
                             mut_ptr_or_null(dbias), stream_of(x));
}

// ---------------------------------------------------------------- cross-entropy

// The targets are copied to the host to be checked (as on the CPU, an out-of-range target is
// an error) and counted, so these wait for the stream. 16-bit logits are read and their dlogits
// written in their dtype; loss, row_stats and grad_loss are f32 then.
void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                   Reduction reduction, const Tensor& loss, const Tensor& row_stats) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const int64_t count = check_and_count_targets(target, c, ignore_index);
  DeviceGuard guard(logits.device().index);
  Tensor row_loss = empty({std::max<int64_t>(n, 1)}, {.dtype = DType::f64, .device = logits.device()});
  launch_cross_entropy(n ? logits.data_ptr() : nullptr, n ? target.data_ptr() : nullptr, target.dtype(),
                       logits.dtype(), n, c, ignore_index, label_smoothing, reduction_code(reduction), count,
                       loss.numel() ? loss.data_ptr() : nullptr, n ? row_stats.data_ptr() : nullptr,
                       row_loss.data<double>(), stream_of(logits));
}

void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats,
                            const Tensor& target, int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits) {
  const int64_t n = logits.size(0), c = logits.size(1);
  const int64_t count = check_and_count_targets(target, c, ignore_index);
  if (n * c == 0) return;
  DeviceGuard guard(logits.device().index);
  launch_cross_entropy_backward(grad_loss.data_ptr(), logits.data_ptr(), row_stats.data_ptr(), target.data_ptr(),
                                target.dtype(), logits.dtype(), n, c, ignore_index, label_smoothing,
                                reduction_code(reduction), count, dlogits.data_ptr(), stream_of(logits));
}

// ---------------------------------------------------------------- dropout

// The same mask as the CPU for the same seed.
void dropout(const Tensor& x, double p, uint64_t seed, const DropoutIndex& at, const Tensor& y, const Tensor& mask) {
  if (x.numel() == 0) return;
  DeviceGuard guard(x.device().index);
  launch_dropout(x.data_ptr(), x.dtype(), x.numel(), p, seed, at, y.data_ptr(), mask.data<bool>(), stream_of(x));
}

void dropout_backward(const Tensor& grad, const Tensor& mask, double p, const Tensor& dx) {
  if (grad.numel() == 0) return;
  DeviceGuard guard(grad.device().index);
  launch_dropout_backward(grad.data_ptr(), mask.data<bool>(), grad.dtype(), grad.numel(), p, dx.data_ptr(),
                          stream_of(grad));
}

// ---------------------------------------------------------------- convolution and pooling

void conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& p, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceGuard guard(x.device().index);
  const int dev = x.device().index;
  const DType dt = x.dtype();
  cudaStream_t stream = stream_of(x);
  ConvPlan c = conv_plan(x, weight, p, out);
  // out_i[o, hw] = W[o, k] @ col_i[k, hw], batched over images with W shared (batch stride 0).
  GemmOperand w{weight.data_ptr(), cpu::row_major(c.k), 0};
  if (c.direct) {
    gemm_raw(dt, c.o, c.hw, c.k, w, {x.data_ptr(), cpu::row_major(c.hw), c.image}, out.data_ptr(), c.hw,
             c.o * c.hw, c.n, 1.0, 0.0, dev);
  } else {
    Tensor col = empty({c.chunk, c.k, c.hw}, {.dtype = dt, .device = x.device()});
    for (int64_t i0 = 0; i0 < c.n; i0 += c.chunk) {
      const int64_t cnt = std::min(c.chunk, c.n - i0);
      launch_im2col(at(x, i0 * c.image), dt, c.s, cnt, col.data_ptr(), stream);
      gemm_raw(dt, c.o, c.hw, c.k, w, {col.data_ptr(), cpu::row_major(c.hw), c.k * c.hw}, at(out, i0 * c.o * c.hw),
               c.hw, c.o * c.hw, cnt, 1.0, 0.0, dev);
    }
  }
  if (bias.defined()) launch_add_channel_bias(out.data_ptr(), bias.data_ptr(), dt, c.n, c.o, c.hw, stream);
}

void conv2d_backward(const Tensor& grad, const Tensor& x, const Tensor& weight, const Conv2dParams& p,
                     const Tensor& dx, const Tensor& dweight, const Tensor& dbias) {
  DeviceGuard guard(x.device().index);
  const int dev = x.device().index;
  const DType dt = x.dtype();
  cudaStream_t stream = stream_of(x);
  ConvPlan c = conv_plan(x, weight, p, grad);
  if (dbias.defined()) {
    if (c.n == 0) Tensor(dbias).zero_();
    else launch_channel_sum(grad.data_ptr(), dbias.data_ptr(), dt, c.n, c.o, c.hw, stream);
  }
  if (c.n == 0 || c.o == 0) {
    // No images: dweight is a sum of nothing. No output channels: dx stays the caller's zeros.
    Tensor(dweight).zero_();
    return;
  }
  Tensor col, dcol;
  if (!c.direct) {
    col = empty({c.chunk, c.k, c.hw}, {.dtype = dt, .device = x.device()});
    dcol = empty({c.chunk, c.k, c.hw}, {.dtype = dt, .device = x.device()});
  }
  // W^T [k, o] is W read column-major.
  GemmOperand wt{weight.data_ptr(), cpu::col_major(c.k), 0};
  for (int64_t i0 = 0; i0 < c.n; i0 += c.chunk) {
    const int64_t cnt = std::min(c.chunk, c.n - i0);
    const void* cols = at(x, i0 * c.image);
    int64_t col_stride = c.image;
    if (!c.direct) {
      launch_im2col(cols, dt, c.s, cnt, col.data_ptr(), stream);
      cols = col.data_ptr();
      col_stride = c.k * c.hw;
    }
    // dweight += g_i[o, hw] @ col_i^T: col_i^T [hw, k] is col_i read column-major. One product
    // per image, accumulating in image order.
    for (int64_t i = 0; i < cnt; ++i) {
      gemm_raw(dt, c.o, c.k, c.hw, {at(grad, (i0 + i) * c.o * c.hw), cpu::row_major(c.hw), 0},
               {static_cast<const char*>(cols) + i * col_stride * int64_t(dtype_size(dt)), cpu::col_major(c.hw), 0},
               dweight.data_ptr(), c.k, 0, 1, 1.0, i0 + i == 0 ? 0.0 : 1.0, dev);
    }
    // dcol_i[k, hw] = W^T @ g_i, batched over the chunk; then dx_i = col2im(dcol_i).
    GemmOperand g{at(grad, i0 * c.o * c.hw), cpu::row_major(c.hw), c.o * c.hw};
    if (c.direct) {
      gemm_raw(dt, c.k, c.hw, c.o, wt, g, at(dx, i0 * c.image), c.hw, c.image, cnt, 1.0, 0.0, dev);
    } else {
      gemm_raw(dt, c.k, c.hw, c.o, wt, g, dcol.data_ptr(), c.hw, c.k * c.hw, cnt, 1.0, 0.0, dev);
      launch_col2im(dcol.data_ptr(), dt, c.s, cnt, at(dx, i0 * c.image), stream);
    }
  }
}

void max_pool2d(const Tensor& x, const Pool2dParams& p, const Tensor& out, const Tensor& indices) {
  if (out.numel() == 0) return;
  DeviceGuard guard(x.device().index);
  launch_max_pool2d(x.data_ptr(), x.dtype(), x.size(0), x.size(1), x.size(2), out.size(1), out.size(2), p.kernel_h,
                    p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, out.data_ptr(), indices.data<int64_t>(),
                    stream_of(x));
}

// An index outside the plane (never produced by max_pool2d) is skipped rather than checked, to
// spare a copy to the host.
void max_pool2d_backward(const Tensor& grad, const Tensor& indices, const Tensor& dx) {
  if (grad.numel() == 0) return;
  DeviceGuard guard(grad.device().index);
  const int64_t planes = grad.size(0), plane_out = grad.size(1) * grad.size(2), plane_in = dx.size(1) * dx.size(2);
  // 16-bit grads accumulate in an f32 buffer (atomics on 16-bit values would round every add).
  const bool wide = grad.dtype() == DType::f32 || grad.dtype() == DType::f64;
  Tensor acc = wide ? dx : zeros(dx.shape(), {.dtype = DType::f32, .device = dx.device()});
  launch_max_pool2d_backward(grad.data_ptr(), indices.data<int64_t>(), grad.dtype(), planes, plane_in, plane_out,
                             acc.data_ptr(), acc.dtype(), stream_of(grad));
  if (!wide) Tensor(dx).copy_(acc);
}

// ---------------------------------------------------------------- optimizers
// Bit-identical to the CPU update (kernels/cpu/optim.cpp) on the same inputs.

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s) {
  WEFT_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64,
             "adam_step: parameters must be f32 or f64 (keep master weights in f32), got {}", tensor_desc(param));
  DeviceGuard guard(param.device().index);
  launch_adam_step(param.data_ptr(), grad.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), param.dtype(),
                   param.numel(), {s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.step, s.decoupled, s.grad_scale},
                   stream_of(param));
}

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& s) {
  WEFT_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64,
             "sgd_step: parameters must be f32 or f64, got {}", tensor_desc(param));
  DeviceGuard guard(param.device().index);
  launch_sgd_step(param.data_ptr(), grad.data_ptr(), mut_ptr_or_null(momentum_buf), param.dtype(), param.numel(),
                  {s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov, s.first, s.grad_scale},
                  stream_of(param));
}

// ---------------------------------------------------------------- attention

AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                               const AttentionRope& rope) {
  AttentionShape s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), causal, scale};
  if (rope.on()) {
    s.rope_cos = rope.tables.cos.data_ptr(), s.rope_sin = rope.tables.sin.data_ptr();
    s.q_pos = rope.q_pos, s.k_pos = rope.k_pos;
  }
  return s;
}

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, const AttentionRope& rope,
               const Tensor& out, const Tensor& lse) {
  DeviceGuard guard(q.device().index);
  const AttentionShape s = attention_shape(q, k, v, causal, scale, rope);
  if (s.B * s.H == 0 || s.Tq == 0) return;
  launch_attention(heads(q), heads(k), heads(v), heads(out), lse.data_ptr(), q.dtype(), s, stream_of(q));
}

void attention_backward(const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, bool causal, double scale, const AttentionRope& rope, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv) {
  DeviceGuard guard(q.device().index);
  const AttentionShape s = attention_shape(q, k, v, causal, scale, rope);
  if (s.B * s.H == 0) return;
  Tensor delta = empty({std::max<int64_t>(s.B * s.H * s.Tq, 1)}, {.dtype = lse.dtype(), .device = q.device()});
  auto view = [&](const Tensor& t) { return t.numel() ? heads(t) : HeadsView{nullptr, 0, 0, 0}; };
  launch_attention_backward(view(grad), view(q), view(k), view(v), view(out), s.Tq ? lse.data_ptr() : nullptr,
                            delta.data_ptr(), view(dq), view(dk), view(dv), q.dtype(), s, stream_of(q));
}

}  // namespace

void fill_nn_ops(KernelBackend& t) {
  t.softmax = &softmax;
  t.softmax_backward = &softmax_backward;
  t.layer_norm = &layer_norm;
  t.layer_norm_backward = &layer_norm_backward;
  t.cross_entropy = &cross_entropy;
  t.cross_entropy_backward = &cross_entropy_backward;
  t.dropout = &dropout;
  t.dropout_backward = &dropout_backward;
  t.conv2d = &conv2d;
  t.conv2d_backward = &conv2d_backward;
  t.max_pool2d = &max_pool2d;
  t.max_pool2d_backward = &max_pool2d_backward;
  t.attention = &attention;
  t.attention_backward = &attention_backward;
  t.adam_step_ = &adam_step_;
  t.sgd_step_ = &sgd_step_;
}

}  // namespace weft::kernels::cuda
