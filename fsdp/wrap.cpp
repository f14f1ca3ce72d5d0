#include "fsdp/wrap.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "dist/dist.h"

namespace weft::fsdp {

std::string_view strategy_name(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
  }
  return "?";
}

ShardingStrategy parse_sharding_strategy(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = char(std::toupper(static_cast<unsigned char>(c)));
  for (auto s : {ShardingStrategy::FULL_SHARD, ShardingStrategy::SHARD_GRAD_OP, ShardingStrategy::NO_SHARD,
                 ShardingStrategy::HYBRID_SHARD})
    if (strategy_name(s) == upper) return s;
  WEFT_ERROR("fsdp: unknown sharding strategy '{}' (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD)", name);
}

FullyShardOptions strategy_options(ShardingStrategy strategy, int shard_size, DeviceType device) {
  if (!dist::is_initialized()) dist::init();
  const int world = dist::world_size();
  // Checked before the mesh's collective, on arguments and the world size only: a bad size
  // fails on every rank and none waits in the mesh's split.
  if (strategy == ShardingStrategy::HYBRID_SHARD)
    WEFT_CHECK(shard_size > 0 && world % shard_size == 0,
               "fsdp: HYBRID_SHARD needs a shard group size that divides the world size {}, got {}", world, shard_size);
  else
    WEFT_CHECK(shard_size == 0, "fsdp: shard_size ({}) applies to HYBRID_SHARD only, not {}", shard_size,
               strategy_name(strategy));
  FullyShardOptions o;
  switch (strategy) {
    case ShardingStrategy::FULL_SHARD:
      o.mesh = std::make_shared<dist::DeviceMesh>(device);
      break;
    case ShardingStrategy::SHARD_GRAD_OP:
      o.mesh = std::make_shared<dist::DeviceMesh>(device);
      o.reshard_after_forward = false;
      break;
    case ShardingStrategy::NO_SHARD:
      // Nothing to free: an all-gather over one rank is a copy, so keep the params gathered.
      o.mesh = std::make_shared<dist::DeviceMesh>(device, std::vector<int>{world, 1},
                                                  std::vector<std::string>{"replicate", "shard"});
      o.reshard_after_forward = false;
      break;
    case ShardingStrategy::HYBRID_SHARD:
      o.mesh = std::make_shared<dist::DeviceMesh>(device, std::vector<int>{world / shard_size, shard_size},
                                                  std::vector<std::string>{"replicate", "shard"});
      break;
  }
  return o;
}

AutoWrapPolicy module_type_policy(std::vector<std::string> type_names) {
  return [types = std::move(type_names)](const nn::Module& m, const std::string&, int64_t) {
    return std::find(types.begin(), types.end(), m.type_name()) != types.end();
  };
}

AutoWrapPolicy size_based_policy(int64_t min_num_params) {
  WEFT_CHECK(min_num_params > 0, "fsdp::size_based_policy: min_num_params must be positive, got {}", min_num_params);
  return [min_num_params](const nn::Module&, const std::string&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
}

namespace {

// Post-order: wraps what the policy selects below `m` and returns the parameter elements of
// m's subtree left unwrapped (0 once m itself is wrapped).
int64_t wrap_below(const nn::ModulePtr& m, const std::string& path, bool is_root, const AutoWrapPolicy& policy,
                   const FullyShardOptions& opts, std::unordered_set<const nn::Module*>& visited) {
  if (!visited.insert(m.get()).second) return 0;  // a module registered twice is wrapped once
  if (fsdp_module(*m)) return 0;                   // sharded by the caller already
  int64_t unwrapped = 0;
  for (auto& [name, child] : m->named_children())
    unwrapped += wrap_below(child, path.empty() ? name : path + "." + name, false, policy, opts, visited);
  for (auto& t : m->parameters(false)) unwrapped += t.numel();
  if (is_root || !policy(*m, path, unwrapped)) return unwrapped;
  fully_shard(m, opts);
  return 0;
}

}  // namespace

FSDPModule apply_auto_wrap(const nn::ModulePtr& root, const AutoWrapPolicy& policy, const FullyShardOptions& opts) {
  WEFT_CHECK(root != nullptr, "fsdp::apply_auto_wrap: root is null");
  WEFT_CHECK(!fsdp_module(*root), "fsdp::apply_auto_wrap: the root {} is already sharded", root->type_name());
  WEFT_CHECK(policy != nullptr, "fsdp::apply_auto_wrap: the policy is empty");
  std::unordered_set<const nn::Module*> visited;
  wrap_below(root, "", true, policy, opts, visited);
  return fully_shard(root, opts);
}

}  // namespace weft::fsdp
