// fsdp: fully sharded data parallelism with the semantics of PyTorch's FSDP2 `fully_shard`.
//
//   for (auto& block : model->blocks) fsdp::fully_shard(block);
//   fsdp::fully_shard(model);
//   nn::AdamW opt(model->parameters(), {.lr = 1e-3});   // steps this rank's shards only
//
// Each call, bottom-up, forms one parameter group from the module's parameters that no earlier call took. Parameter
// names and the module tree do not change; the registered parameters become this rank's shards. Forward and backward
// then gather, free and reduce them through hooks (see fsdp/state.h and docs/FSDP.md).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/stream.h"
#include "options.h"
#include "param_group.h"
#include "../nn/module.h"
#include "../tp/split.h"

namespace weft::fsdp {

using nn::TensorList;

class FSDPState;

// Where one parameter's shard sits in the global tensor: the parameter fully_shard was given, itself a tensor-parallel
// part when `split` says so (tp/split.h; `split_group` holds the other parts).
struct ShardInfo {
  Shape global_shape;  // of the parameter fully_shard was given
  int64_t shard_dim = 0;
  int64_t offset = 0;  // first index along shard_dim held by this rank
  int64_t length = 0;  // indices held (0 for ranks past the end)
  int world_size = 1, rank = 0;
  tp::Split split;
  dist::ProcessGroupPtr split_group;
};

// The handle fully_shard returns: FSDP2's FSDPModule methods.
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}
  nn::Module& module() const;

  // Gathers the parameters now (async: returns after starting the all-gather; call wait()).
  class UnshardHandle {
   public:
    explicit UnshardHandle(std::shared_ptr<FSDPState> s) : state_(std::move(s)) {}
    void wait();
   private:
    std::shared_ptr<FSDPState> state_;
  };
  UnshardHandle unshard(bool async_op = false);
  void reshard();

  // Gradient accumulation: false skips the reduce-scatter and keeps unsharded gradients
  // until a backward with true. Applies to every sharded module below too unless !recurse.
  void set_requires_gradient_sync(bool sync, bool recurse = true);
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  void set_reshard_after_forward(bool reshard, bool recurse = true);
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // false: the end of this backward does not wait for the reduce-scatters (the next one will).
  void set_is_last_backward(bool last);
  // Reduce with SUM then divide by `factor` instead of averaging over ranks.
  void set_reduce_scatter_divide_factor(double factor);
  // false: the parameters are not gathered again for backward (only safe when the backward
  // of this module does not read them).
  void set_unshard_in_backward(bool unshard);
  // HSDP: false skips the all-reduce across replicas (keeps per-replica gradients).
  void set_requires_all_reduce(bool all_reduce, bool recurse = true);
  // The next forward's all-gathers also wait for `event` (e.g. recorded after an optimizer step
  // run on another stream); used once, then dropped: set a new event every step. Applies to
  // the whole root. On the CPU events are complete when recorded, so it orders nothing.
  void set_post_optim_event(Event event);

  // The full value of a parameter of this group (all-gathered; a collective call).
  Tensor full_tensor(const std::string& name) const;
  // The full tensor from every rank's `local`, a tensor shaped like this rank's shard of
  // parameter `name` (e.g. its optimizer state); a collective call.
  Tensor gather_shard(const std::string& name, const Tensor& local) const;
  ShardInfo shard_info(const std::string& name) const;
  // Whether `name` is a parameter sharded by this module's group or one below it.
  bool shards(const std::string& name) const { return lookup_param(name) != nullptr; }
  // Collectives issued by this module's group (and, with recurse, by all groups below).
  CommStats comm_stats(bool recurse = true) const;
  const std::shared_ptr<FSDPState>& state() const { return state_; }
  // The state of this module's group and of every group below it, each once.
  std::vector<FSDPState*> subtree() const;

 private:
  const FSDPParam& find_param(const std::string& name) const;
  const FSDPParam* lookup_param(const std::string& name) const;  // null if not sharded here
  std::shared_ptr<FSDPState> state_;
};

FSDPModule fully_shard(const nn::ModulePtr& module, const FullyShardOptions& options = {});
// One group for several sibling modules (FSDP2's fully_shard on a list): one all-gather and one reduce-scatter for all
// of them, gathered when the first of them starts its forward and resharded when the last one ends it. Every forward
// that needs gradients must run all of them. The handle names their parameters as a ModuleList of them would
// ("0.weight", "1.weight"); module() is the first of them.
FSDPModule fully_shard(const std::vector<nn::ModulePtr>& modules, const FullyShardOptions& options = {});
// The FSDPModule of a module fully_shard was applied to, if any.
std::optional<FSDPModule> fsdp_module(const nn::Module& module);

}  // namespace weft::fsdp
