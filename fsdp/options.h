// fsdp: the options of fully_shard, as FSDP2's: where to shard (mesh), when to free
// unsharded parameters, which dim each parameter is sharded on, mixed precision and offload.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <variant>

#include "../core/tensor.h"
#include "../dist/device_mesh.h"

namespace weft::fsdp {

// Mixed precision: parameters are all-gathered and used in param_dtype, gradients are
// reduced in reduce_dtype, and the sharded parameters (and the optimizer) stay in their own
// dtype (f32 master weights). Unset fields keep the parameter's dtype.
struct MixedPrecisionPolicy {
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  std::optional<DType> output_dtype;  // forward outputs of the module cast to this
  bool cast_forward_inputs = true;    // floating inputs cast to param_dtype
};

// Keeps sharded parameters, gradients and optimizer state in (pinned) host memory with the optimizer step on the CPU.
// With CPU tensors that is already where they are: accepted and a no-op on CPU-only builds.
struct CPUOffloadPolicy {
  bool pin_memory = true;
};

struct FullyShardOptions {
  // Ranks to shard over: a 1-D mesh shards over all of it; a 2-D (replicate, shard) mesh shards
  // over dim 1 and averages gradients over dim 0 (HSDP). Null: the 1-D world mesh.
  std::shared_ptr<dist::DeviceMesh> mesh;
  // After forward: true frees the unsharded parameters (gathered again for backward), false keeps them until after
  // backward, an int k keeps 1/k of them per rank so that backward gathers within groups of k neighbouring ranks (k
  // must divide the world size; 1-D meshes). Unset: true, except for the root module (false).
  std::optional<std::variant<bool, int>> reshard_after_forward;
  // Dim to shard each parameter on (default 0); other dims must divide evenly.
  std::function<int64_t(const std::string& name, const Tensor& param)> shard_placement_fn;
  MixedPrecisionPolicy mp_policy;
  std::optional<CPUOffloadPolicy> offload_policy;
};

}  // namespace weft::fsdp
