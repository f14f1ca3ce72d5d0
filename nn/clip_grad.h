// nn: gradient clipping, as torch.nn.utils.clip_grad_norm_, for whole and sharded parameters alike. A parameter held in
// part (a shard registered by fsdp::fully_shard) carries a PartialReduction (core/partial_reduction.h) naming the
// processes that hold the other parts: the local sums (or maxima) are combined through it, once per set of processes,
// so every rank gets the norm of the whole model and scales its own parts by the same factor.
//
//   loss.backward();
//   double norm = nn::clip_grad_norm_(model->parameters(), 1.0);  // sharded: every rank calls it
//   opt.step();
#pragma once
#include <vector>

#include "../core/tensor.h"

namespace weft::nn {

// Scales all gradients so that their global norm is at most max_norm and returns the norm before clipping (the same on
// every rank), as torch.nn.utils.clip_grad_norm_: coefficient max_norm / (norm + 1e-6) when that is < 1. norm_type: any
// p > 0 (sum of |g|^p in f64, then the p-th root) or inf (max |g|). Parameters without a gradient are skipped. With
// sharded parameters it is a collective over their groups (a gather of max_norm and norm_type, then one all-reduce per
// group of ranks): every rank passes its parameters in the same order, and ranks whose max_norm or norm_type differ, or
// that pass a refused value, all fail alike.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

// The same norm (and collectives), the gradients left as they are: `coef` is the factor
// clip_grad_norm_ would scale them by (1 when the norm is at most max_norm), for an optimizer's
// step_scaled to apply as it reads them, a pass over the gradients fewer.
struct GradClip { double norm, coef; };
GradClip clip_grad_coefficient(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace weft::nn
