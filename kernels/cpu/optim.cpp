// kernels/cpu: the fused Adam/AdamW and SGD update loops behind kernels/optim.h. The scalar factors are rounded to the
// parameter type before use, as PyTorch does when it passes Python floats to its kernels. Rounding follows PyTorch's
// vectorized CPU kernels: `add(x, alpha=a)`, `addcmul(t1, t2, value=v)` and `lerp` end in one fused multiply-add
// (std::fma here); every other multiply, add and divide rounds on its own, so the compiler must not contract anything
// else in this file.
#pragma GCC optimize("fp-contract=off")

#include <cmath>

#include "core/dispatch.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

template <typename T>
void adam_loop(T* p, const T* g, T* m, T* v, int64_t n, const AdamStep& s) {
  const double bc1 = 1 - std::pow(s.beta1, double(s.step));
  const double bc2 = 1 - std::pow(s.beta2, double(s.step));
  const T decay = T(1 - s.lr * s.weight_decay);
  const T wd = T(s.weight_decay);
  const T w1 = T(1 - s.beta1), coef = std::abs(w1) < T(0.5) ? w1 : w1 - T(1);  // PyTorch's lerp: two forms
  const T b2 = T(s.beta2), w2 = T(1 - s.beta2);
  const T neg_step = T(-(s.lr / bc1));
  const T bc2_sqrt = T(std::sqrt(bc2));
  const T eps = T(s.eps);
  const bool decoupled = s.decoupled, has_wd = s.weight_decay != 0;
  const T gs = T(s.grad_scale);
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i], gi = g[i] * gs;                  // grad.mul_(clip_coef) (x 1: the same bits)
    if (has_wd) {
      if (decoupled) pi = pi * decay;             // param.mul_(1 - lr * wd)
      else gi = std::fma(wd, pi, gi);             // grad.add(param, alpha=wd)
    }
    T mi = std::fma(coef, gi - m[i], coef == w1 ? m[i] : gi);  // exp_avg.lerp_(grad, w1): |w1| < 0.5 from m
    T vi = v[i] * b2;                             // exp_avg_sq.mul_(beta2)
    vi = std::fma(w2 * gi, gi, vi);               //   .addcmul_(grad, grad, value=1-beta2)
    T denom = std::sqrt(vi) / bc2_sqrt + eps;     // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    p[i] = pi + neg_step * mi / denom;            // param.addcdiv_(exp_avg, denom, value=-step_size)
    m[i] = mi;
    v[i] = vi;
  }
}

template <typename T>
void sgd_loop(T* p, const T* g, T* buf, int64_t n, const SgdStep& s) {
  const T wd = T(s.weight_decay), mom = T(s.momentum), damp = T(1 - s.dampening), neg_lr = T(-s.lr);
  const bool has_wd = s.weight_decay != 0, has_mom = s.momentum != 0;
  const T gs = T(s.grad_scale);
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i] * gs;
    if (has_wd) d = std::fma(wd, p[i], d);        // d_p.add(param, alpha=wd)
    if (has_mom) {
      // clone on the first step, else buf.mul_(momentum).add_(d_p, alpha=1-dampening)
      T b = s.first ? d : std::fma(damp, d, buf[i] * mom);
      buf[i] = b;
      d = s.nesterov ? std::fma(mom, b, d) : b;   // d_p.add(buf, alpha=momentum)
    }
    p[i] = std::fma(neg_lr, d, p[i]);             // param.add_(d_p, alpha=-lr)
  }
}

}  // namespace

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s) {
  switch (param.dtype()) {
    case DType::f32:
      return adam_loop(param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(),
                       param.numel(), s);
    case DType::f64:
      return adam_loop(param.data<double>(), grad.data<double>(), exp_avg.data<double>(),
                       exp_avg_sq.data<double>(), param.numel(), s);
    default:
      WEFT_ERROR("adam_step: parameters must be f32 or f64 (keep master weights in f32), got {}", tensor_desc(param));
  }
}

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& buf, const SgdStep& s) {
  switch (param.dtype()) {
    case DType::f32:
      return sgd_loop(param.data<float>(), grad.data<float>(), buf.defined() ? buf.data<float>() : nullptr,
                      param.numel(), s);
    case DType::f64:
      return sgd_loop(param.data<double>(), grad.data<double>(), buf.defined() ? buf.data<double>() : nullptr,
                      param.numel(), s);
    default:
      WEFT_ERROR("sgd_step: parameters must be f32 or f64, got {}", tensor_desc(param));
  }
}

}  // namespace weft::kernels::cpu
