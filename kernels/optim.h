// kernels: fused optimizer updates, in place over contiguous f32/f64 tensors. Each performs exactly the floating-point
// operations of PyTorch's single-tensor update (torch.optim in 1.13, the version Debian 12 ships), in the same order
// and precision, so parameters agree to the last bit on the same inputs.
#pragma once
#include "../core/tensor.h"

namespace weft::kernels {

// grad_scale: the update reads each gradient times it, rounded to the gradient's dtype (the bits of
// scaling the gradient in place first, as clip_grad_norm_ does), and writes no gradient.
struct AdamStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;     // 1 for the first update
  bool decoupled;   // AdamW (decay the parameter) vs Adam (L2 term added to the gradient)
  double grad_scale = 1;
};
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamStep& s);

struct SgdStep {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // the momentum buffer is initialised to the gradient on the first step
  double grad_scale = 1;
};
// momentum_buf may be undefined when momentum == 0.
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdStep& s);

}  // namespace weft::kernels
