// fsdp: gradient clipping of a sharded module. nn::clip_grad_norm_ itself handles sharded
// parameters (fully_shard attaches to each shard a reduction over its shard group), so
//
//   double norm = nn::clip_grad_norm_(model->parameters(), 1.0);   // every rank calls it
//
// is the whole story while the module holds its shards. This overload takes the shards from
// the module's parameter groups instead, which is the same except for a group kept gathered
// after backward (set_reshard_after_backward(false)): its module slots then hold the unsharded
// parameters, while the reduced gradients are on the shards.
#pragma once
#include "fully_shard.h"
#include "../nn/clip_grad.h"

namespace weft::fsdp {

// nn::clip_grad_norm_ over every shard under `module`. A collective on every rank of its mesh.
double clip_grad_norm_(const FSDPModule& module, double max_norm, double norm_type = 2.0);

}  // namespace weft::fsdp
