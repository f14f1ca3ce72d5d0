// fsdp: the per-module state behind fully_shard. It hooks the module's forward (pre: unshard
// and prefetch the next group; post: reshard and arm the backward hooks), the gradients of
// its outputs (pre-backward: unshard again and prefetch in reverse order) and of its inputs
// (post-backward through an identity Function: reduce-scatter and reshard). The root state —
// the outermost sharded module run in forward — also validates the model across ranks on the
// first forward and, at the end of every backward, finishes what its descendants left.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "fsdp/param_group.h"

namespace weft::fsdp {

using nn::TensorList;

class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  FSDPState(nn::Module& module, const FullyShardOptions& opts, std::unique_ptr<FSDPParamGroup> group,
            std::shared_ptr<dist::DeviceMesh> mesh);

  nn::Module& module;
  std::unique_ptr<FSDPParamGroup> group;  // null when the module had no unsharded parameters left
  std::shared_ptr<dist::DeviceMesh> mesh;
  MixedPrecisionPolicy mp;
  std::optional<bool> reshard_after_forward;  // resolved at lazy init
  dist::ProcessGroupPtr reshard_group;        // reshard_after_forward = k: the k ranks to keep 1/k for
  bool requires_gradient_sync = true;
  bool reshard_after_backward = true;
  bool unshard_in_backward = true;
  bool is_last_backward = true;
  std::vector<std::weak_ptr<FSDPState>> forward_prefetch, backward_prefetch;  // explicit; empty: implicit
  bool explicit_forward_prefetch = false, explicit_backward_prefetch = false;

  // Root bookkeeping.
  std::optional<bool> is_root;
  FSDPState* root = nullptr;
  std::vector<FSDPState*> states;         // root: every state under it, pre-order, itself first
  std::vector<FSDPState*> forward_order;  // root: states in the order their forward ran
  bool order_recorded = false;

  // Per iteration.
  bool pre_backward_done = false;
  bool post_backward_done = false;
  uint64_t forward_started_us = 0, backward_started_us = 0;  // for traces
  std::string path;  // the module's path under the root ("blocks.3"; the root's type name)
  bool callback_queued = false;  // root: the end-of-backward callback of this backward is queued
  FSDPState* last_reduce_scatter = nullptr;  // root: the group whose reduce-scatter was started last

  std::optional<TensorList> pre_forward(const TensorList& inputs);
  std::optional<TensorList> post_forward(const TensorList& outputs);
  void pre_backward();
  void post_backward();
  void root_final_callback();  // root only

 private:
  void lazy_init();
  void validate_across_ranks();
  void reset_iteration();  // root: recover from an interrupted step
  FSDPState* next_in_order(int direction);
};

// The state fully_shard attached to a module, or null.
std::shared_ptr<FSDPState> state_of(const nn::Module& module);

}  // namespace weft::fsdp
