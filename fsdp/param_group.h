// fsdp: a parameter group — the parameters one fully_shard call took over. Its shards live in one flat buffer, so
// unsharding is one all-gather (straight from that buffer) followed by copies out into each unsharded parameter, and
// gradient reduction is one reduce-scatter of all the group's gradients packed into one buffer. This file holds the
// group's state and its unshard / reshard / reduce logic; the collectives themselves (copy-in, all-gather, copy-out,
// gradient packing, reduce-scatter, accumulate) are free functions in fsdp/collectives.h, issued on the streams of the
// group's communication context (fsdp/comm_context.h).
#pragma once
#include <memory>
#include <vector>

#include "../dist/process_group.h"
#include "fsdp_param.h"
#include "options.h"
#include "../nn/tree_sum.h"

namespace weft::fsdp {

class CommContext;         // fsdp/comm_context.h
struct AllGatherResult;     // fsdp/collectives.h
struct ReduceScatterResult;

struct CommStats {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
  int64_t reduce_scatter_elements = 0;  // sent by this rank: the ranks times the gradient columns
};

class FSDPParamGroup {
 public:
  struct Entry {
    std::string name;
    std::vector<Tensor*> slots;
    int64_t shard_dim;
  };
  FSDPParamGroup(std::vector<Entry> entries, const FullyShardOptions& opts, dist::ProcessGroupPtr shard_group,
                 dist::ProcessGroupPtr replicate_group);
  ~FSDPParamGroup();

  const std::vector<std::unique_ptr<FSDPParam>>& params() const { return params_; }
  const Tensor& flat_shard() const { return flat_shard_; }
  DType unsharded_dtype() const { return param_dtype_; }
  const dist::ProcessGroupPtr& shard_group() const { return shard_group_; }
  // Where forward and backward run and the collectives' buffers live: the parameters' device.
  // The shards live there too, except with CPU offload of CUDA parameters (offloaded()): then
  // the flat shard buffer, the sharded gradients and the optimizer are on the host.
  Device compute_device() const { return compute_device_; }
  bool offloaded() const { return offload_; }
  // The streams and held buffers of this group's collectives; the root's lazy init makes every
  // group under it share the root's.
  const std::shared_ptr<CommContext>& comm_context() const { return comm_; }
  void set_comm_context(std::shared_ptr<CommContext> ctx);
  // Before each forward: takes up requires_grad changed on its parameters and lays out the gradient columns again.
  void follow_requires_grad();

  // partial: after a forward with reshard_after_forward = k, each rank keeps its 1/k chunk of
  // the full parameters, gathered again within its group of k ranks for backward.
  enum class State { sharded, partial, gathering, unsharded };
  State state() const { return state_; }
  // Starts the all-gather unless already gathering or unsharded.
  void start_unshard();
  // Completes a started all-gather (or runs one) and points the module slots at the unsharded parameters.
  void finish_unshard();
  // Frees the unsharded parameters and points the slots back at the sharded ones.
  void reshard();
  // Keeps this rank's chunk of the full parameters for its group of `post_forward_group`'s
  // ranks, then reshards (state partial).
  void reshard_to_subgroup(const dist::ProcessGroupPtr& post_forward_group);

  // After backward: packs the unsharded gradients and starts their reduce-scatter (and, with
  // HSDP, the all-reduce across replicas happens in finish); frees the unsharded gradients.
  void start_reduce_scatter();
  std::string reduce_label() const;
  bool reduce_scatter_pending() const { return pending_rs_ != nullptr; }
  // Waits for the reduce-scatter and accumulates into the sharded parameters' .grad.
  void finish_reduce_scatter();
  bool has_unsharded_grads() const;
  // Deterministic mode (core/deterministic.h), at each post-backward: packs the unsharded gradients as the next leaf of
  // this backward's tree and frees them. start_reduce_scatter then reduces the tree's sum with an all-to-all and sums
  // the ranks' partials in rank order: the same bits at any world size when each rank runs the same power-of-two number
  // of backwards per reduction (leaf i of rank r being leaf r * count + i of one tree).
  void add_grad_leaf();
  // Moves the unsharded gradients into accumulators of the reduce dtype when it differs from
  // the param dtype (no-op otherwise); called at each post-backward.
  void accumulate_unsharded_grads();

  double reduce_scatter_divide_factor = 0;  // 0: average over the shard (and replica) ranks
  bool requires_all_reduce = true;          // HSDP: average over replicas
  CommStats stats;
  std::string label;  // names the group in traces: its module's path under the root
  // The tensors the shards replaced, to recognise a tied copy registered outside the group.
  std::vector<std::weak_ptr<TensorImpl>> originals;

 private:
  std::vector<std::unique_ptr<FSDPParam>> params_;
  void lay_out_grads();  // the columns of the parameters that require gradients, in order, from 0
  dist::ProcessGroupPtr shard_group_, replicate_group_;
  Tensor flat_shard_;
  int64_t group_numel_ = 0;
  int64_t grad_numel_ = 0;  // the reduce-scatter's columns: the parameters that require gradients
  DType param_dtype_, reduce_dtype_;
  State state_ = State::sharded;
  // reshard_after_forward = k: the subgroup, this rank's chunks of it, and their offsets.
  dist::ProcessGroupPtr partial_group_;
  Tensor partial_shard_;
  std::vector<int64_t> partial_offsets_;
  bool gathering_partial_ = false;
  Device compute_device_;
  bool offload_ = false;
  std::shared_ptr<CommContext> comm_;
  std::unique_ptr<AllGatherResult> gather_;       // while gathering
  std::unique_ptr<ReduceScatterResult> pending_rs_;  // between start and finish_reduce_scatter
  nn::TreeSum grad_leaves_;  // deterministic mode: this rank's packed gradients since the last reduction
  Tensor partial_reduce_output_;  // HSDP: reduce-scatter outputs not yet all-reduced (requires_all_reduce off)
};

}  // namespace weft::fsdp
