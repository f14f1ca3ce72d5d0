#include "fsdp/clip_grad.h"

#include <cmath>

#include "core/grad_mode.h"
#include "dist/dist.h"
#include "fsdp/state.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft::fsdp {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       dist::ProcessGroupPtr group) {
  // Checks on arguments only, which every rank shares, so a bad call fails on all of them.
  WEFT_CHECK(norm_type == 2.0 || std::isinf(norm_type), "fsdp::clip_grad_norm_: norm_type must be 2 or inf, got {}",
             norm_type);
  WEFT_CHECK(max_norm >= 0, "fsdp::clip_grad_norm_: max_norm must be >= 0, got {}", max_norm);
  if (!dist::is_initialized()) dist::init();
  if (!group) group = dist::world();
  const bool inf = std::isinf(norm_type);
  NoGradGuard no_grad;
  double local = 0;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    // Ranks past the end of a short parameter hold empty shards: nothing to add.
    if (!g.defined() || g.numel() == 0) continue;
    if (inf) {
      Tensor abs = kernels::unary(kernels::UnaryOp::abs, g);
      local = std::max(local, kernels::reduce(kernels::ReduceOp::max, abs, {}, false).item());
    } else {
      Tensor g64 = g.to(DType::f64);  // f64 sum of squares, as nn::clip_grad_norm_
      Tensor sq = kernels::binary(kernels::BinaryOp::mul, g64, g64);
      local += kernels::reduce(kernels::ReduceOp::sum, sq, {}, false).item();
    }
  }
  Tensor total = from_vector({local}, {1}, {.dtype = DType::f64}).to(group->device());
  group->all_reduce(total, inf ? dist::ReduceOp::max : dist::ReduceOp::sum)->wait();
  double norm = total.to(Device::cpu()).item();
  if (!inf) norm = std::sqrt(norm);
  double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const Tensor& p : params)
      if (p.grad().defined() && p.grad().numel() > 0) kernels::mul_scalar_(p.grad(), coef);
  return norm;
}

double clip_grad_norm_(const FSDPModule& module, double max_norm, double norm_type) {
  // The groups' shards rather than the module's slots: a group kept gathered after backward
  // (set_reshard_after_backward(false)) has its unsharded parameters in the slots, while the
  // reduced gradients are on the shards.
  std::vector<Tensor> shards;
  for (auto& [name, m] : module.module().named_modules())
    if (auto s = state_of(*m); s && s->group)
      for (auto& p : s->group->params()) shards.push_back(p->sharded());
  const auto& mesh = module.state()->mesh;
  return clip_grad_norm_(shards, max_norm, norm_type, mesh->group(mesh->ndim() - 1));
}

}  // namespace weft::fsdp
