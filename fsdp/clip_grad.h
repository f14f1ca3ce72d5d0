// fsdp: gradient clipping over sharded gradients. Each rank holds only its shard of every
// gradient, so the local norm is partial: the ranks sum their squares (or take the max, for
// the inf-norm) across the shard group before clipping. Gives the same norm and the same
// clipped gradients as nn::clip_grad_norm_ on the unsharded model.
//
//   loss.backward();
//   double norm = fsdp::clip_grad_norm_(model->parameters(), 1.0);   // every rank calls it
//   opt.step();
#pragma once
#include <vector>

#include "dist/process_group.h"
#include "fsdp/fully_shard.h"

namespace weft::fsdp {

// `params`: this rank's shards (what model->parameters() holds after fully_shard). Their
// squared gradients (f64) are summed over `group` (default: dist::world()), so each element
// of the global gradient must be held by exactly one rank of `group`: with HSDP or NO_SHARD
// pass the mesh's shard group, or use the overload below. Scales the local gradients by
// max_norm / (norm + 1e-6) when that is < 1 and returns the norm before clipping, the same on
// every rank. norm_type: 2 or inf. A collective: every rank of `group` calls it.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       dist::ProcessGroupPtr group = nullptr);

// All parameters under a sharded module, reduced over its mesh's shard group (correct for
// 1-D meshes, HSDP and NO_SHARD alike, since replicas hold equal gradients).
double clip_grad_norm_(const FSDPModule& module, double max_norm, double norm_type = 2.0);

}  // namespace weft::fsdp
