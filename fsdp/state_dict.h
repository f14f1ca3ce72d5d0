// fsdp: full (unsharded) state dicts of a sharded model and of its optimizer, as one process would have them, and the
// way back from a full state dict to this rank's shards, so a model trained without FSDP can continue sharded and the
// other way round. Gathering is a collective call on every rank of the shard group, one all-gather per tensor, so at
// most one gathered tensor exists at a time on ranks that do not keep the result. The optimizer's state is keyed by
// parameter names (see fsdp/sharded_state_dict.h). `root` null: the model is not sharded and nothing communicates.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "sharded_state_dict.h"

namespace weft::fsdp {

struct FullStateDictOptions {
  bool rank0_only = false;   // only global rank 0 keeps the result; the others get an empty list
  bool cpu_offload = false;  // results on the CPU (gathered one tensor at a time, then moved)
};

// Parameters (gathered, a tied one under each of its names) and buffers under their usual names.
nn::NamedTensorList full_state_dict(nn::Module& model, const FSDPModule* root, const FullStateDictOptions& opts = {});
// The optimizer's state dict with every per-element state gathered to its parameter's shape.
// Ranks whose states differ in their keys (a shard that never had a gradient) fail together.
nn::NamedTensorList full_optimizer_state_dict(const nn::Optimizer& opt, nn::Module& model, const FSDPModule* root,
                                              const FullStateDictOptions& opts = {});

// Loads a full state dict into the (sharded) model: each rank takes its slice; no communication. Every parameter and
// buffer must be present with its full shape; a key that names a tied parameter's second name, or is listed in
// `aliases` (key -> parameter it duplicates, e.g. a tied LM head saved separately), must equal that parameter; any
// other key is an error. Nothing is written unless everything fits.
void load_full_state_dict(nn::Module& model, const nn::NamedTensorList& full, const FSDPModule* root,
                          const std::map<std::string, std::string>& aliases = {});
// The same from a full state dict only global rank 0 holds (full_state_dict's rank0_only, or a file
// only rank 0 reads; the other ranks pass {}), as torch's set_model_state_dict with
// broadcast_from_rank0: rank 0 checks it whole by load_full_state_dict's rules (a failure fails
// every rank), then broadcasts it over the world one tensor at a time, and each rank keeps its slice.
void broadcast_full_state_dict(nn::Module& model, const nn::NamedTensorList& full, const FSDPModule* root,
                               const std::map<std::string, std::string>& aliases = {});
// The optimizer's state from a full (name-keyed) optimizer state dict: each rank takes its slice.
void load_full_optimizer_state_dict(nn::Optimizer& opt, nn::Module& model, const nn::NamedTensorList& full,
                                    const FSDPModule* root);

}  // namespace weft::fsdp
