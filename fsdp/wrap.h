// fsdp: FSDP1/FairScale conveniences on top of fully_shard — sharding strategies as named
// option presets, and auto-wrap policies that pick the modules to shard.
//
//   auto opts = fsdp::strategy_options(fsdp::ShardingStrategy::HYBRID_SHARD, /*shard_size=*/2);
//   auto root = fsdp::apply_auto_wrap(model, fsdp::module_type_policy({"Block"}), opts);
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "fully_shard.h"

namespace weft::fsdp {

enum class ShardingStrategy {
  FULL_SHARD,     // shard params, grads, optimizer state; free gathered params after forward
  SHARD_GRAD_OP,  // as FULL_SHARD, but keep params gathered from forward until after backward
  NO_SHARD,       // every rank holds full params; gradients are all-reduced (DDP)
  HYBRID_SHARD,   // FULL_SHARD within groups of shard_size ranks, replicated across groups
};
std::string_view strategy_name(ShardingStrategy strategy);  // "FULL_SHARD", ...
ShardingStrategy parse_sharding_strategy(std::string_view name);  // the names above, any case

// fully_shard options for a strategy (the other fields stay default: set mp_policy etc. on the
// result). Builds the strategy's mesh, a collective call on every rank, so build it once and
// pass the same options to every fully_shard call of a model:
// - FULL_SHARD: 1-D mesh over the world; reshard_after_forward unset (true, except the root
//   keeps its params for the backward that follows at once, as FSDP1 did);
// - SHARD_GRAD_OP: 1-D mesh; reshard_after_forward false;
// - NO_SHARD: 2-D mesh (world, 1): shards of one rank, gradients averaged over all ranks;
// - HYBRID_SHARD: 2-D mesh (world / shard_size, shard_size); shard_size must divide the world
//   size (neighbouring ranks share a shard group: make it one host).
FullyShardOptions strategy_options(ShardingStrategy strategy, int shard_size = 0,
                                   DeviceType device = DeviceType::cpu);

// Decides whether to shard a (non-root) module: `path` is its dotted name under the root, `unwrapped_params` the number
// of parameter elements in its subtree that no module below it was sharded for.
using AutoWrapPolicy =
    std::function<bool(const nn::Module& module, const std::string& path, int64_t unwrapped_params)>;
// Modules whose type_name() is one of `type_names` (FSDP1's ModuleWrapPolicy).
AutoWrapPolicy module_type_policy(std::vector<std::string> type_names);
// Modules whose not-yet-sharded parameters reach min_num_params (size_based_auto_wrap_policy).
AutoWrapPolicy size_based_policy(int64_t min_num_params);

// Walks the tree bottom-up (children before parents), calls fully_shard(m, options) on every
// module the policy selects, then on the root, and returns the root's FSDPModule. Modules
// already sharded by the caller count as wrapped and are left alone.
FSDPModule apply_auto_wrap(const nn::ModulePtr& root, const AutoWrapPolicy& policy,
                           const FullyShardOptions& options = {});

}  // namespace weft::fsdp
