// autograd: autocast, weft's mixed-precision policy for runs without FSDP (the CPU semantics
// of torch.autocast). While an AutocastGuard is alive on a thread:
// - the products (linear, matmul, conv2d and the attention ops) compute from 16-bit copies of their
//   f32 inputs, accumulate in f32 and return the 16-bit dtype; their gradients come back in
//   each input's own dtype (an f32 weight gets an f32 gradient, computed from the 16-bit
//   operands and never rounded to 16 bits);
// - cross_entropy computes in f32 whatever its logits' dtype;
// - everything else runs in its inputs' dtype: norms keep f32 statistics, and an element-wise op (or a norm's input
//   and its weights) on f32 and bf16 operands promotes to f32, so a residual stream that starts f32 stays f32.
// Parameters stay as they are (the f32 master weights the optimizer steps); the casts are part
// of the graph. Products that read the same tensor in a row (Llama's q, k and v projections of one normalised x) share
// one 16-bit copy of it, made again if the tensor is written in between. The state is per thread, like grad mode;
// activation checkpointing recomputes under the state its forward ran with. FSDP's counterpart: MixedPrecisionPolicy.
#pragma once
#include <optional>

#include "../core/tensor.h"

namespace weft {

// RAII: products compute in `dtype` (bf16 or f16) in its scope; enabled = false turns autocast
// off in the scope (as torch.autocast(enabled=False)). Restores the previous state on exit.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::bf16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> prev_;
};

// The dtype products compute in on this thread: set under an AutocastGuard, else none.
std::optional<DType> autocast_dtype();
// x in autocast's dtype when autocast is on and x is floating (a differentiable cast), else x:
// what the products apply to their operands.
Tensor autocast_input(const Tensor& x);

}  // namespace weft
