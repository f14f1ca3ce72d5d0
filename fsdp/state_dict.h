// fsdp: full (unsharded) state dicts of a sharded model and of its optimizer, as one process
// would have them, and the way back to this rank's shards. Gathering is a collective call on
// every rank of the shard group (one all-gather per tensor); every rank gets the result.
#pragma once
#include <string>
#include <vector>

#include "fsdp/fully_shard.h"
#include "nn/optimizer.h"

namespace weft::fsdp {

// Parameters (gathered) and buffers (not sharded) under their usual names.
nn::NamedTensorList full_state_dict(nn::Module& model, const FSDPModule& root);
// The optimizer's state dict with every per-element state ("state.<i>.exp_avg", ...) gathered
// to the parameter's full shape. `param_names[i]` names the optimizer's i-th parameter (its
// groups concatenated, e.g. `named_parameters()` order for an optimizer built from
// `parameters()`). Ranks whose states differ in their keys fail together.
nn::NamedTensorList full_optimizer_state_dict(const nn::Optimizer& opt, const std::vector<std::string>& param_names,
                                              const FSDPModule& root);
// The inverse for loading: this rank's slice of each per-element state of a full state dict.
nn::NamedTensorList local_optimizer_state_dict(const nn::NamedTensorList& full,
                                               const std::vector<std::string>& param_names, const FSDPModule& root);

}  // namespace weft::fsdp
