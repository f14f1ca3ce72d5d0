// fsdp: SummonFullParams, FSDP1's summon_full_params as a scope guard. While it lives, the
// parameters of every sharded module under `module` are their full tensors (gathered from the
// shards), to read, save or edit in place; when it ends, each rank copies its slice of the
// (possibly edited) full tensors back into its shard and the parameters are shards again.
//
//   {
//     fsdp::SummonFullParams full(root);                  // a collective: every rank
//     NoGradGuard no_grad;
//     model->fc1->weight.fill_(0.5);                      // persists into the shards
//   }
//
// A parameter replaced inside the guard (set_parameter, to(dtype)) counts as an edit of the same
// shape. Not inside forward or backward, nor between them (the error says so). A forward of a sharded
// module inside the guard runs under NoGradGuard only (evaluation): edits reach the shards
// first, and the parameters are the full tensors again afterwards.
#pragma once
#include <memory>
#include <vector>

#include "fully_shard.h"

namespace weft::fsdp {

// FSDP1's summon_full_params arguments.
struct SummonOptions {
  bool recurse = true;          // also the sharded modules below `module` (false: its own group only)
  bool writeback = true;        // copy the full tensors back into the shards on exit
  bool rank0_only = false;      // only world rank 0 sees full tensors (the others keep shards); no writeback
  bool offload_to_cpu = false;  // the full tensors live in host memory (device groups; CPU ones already do)
};

class SummonFullParams {
 public:
  explicit SummonFullParams(const FSDPModule& module, SummonOptions options = {});
  ~SummonFullParams();  // exit(); an error there is printed, not thrown
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;
  // Ends the scope now: writes back (if asked) and restores the shards. Idempotent.
  void exit();

 private:
  struct Held {
    FSDPParam* param;
    FSDPParamGroup* group;
    Tensor full;                 // undefined on ranks that do not hold it (rank0_only)
    std::vector<Tensor*> slots;  // every module slot of the parameter (tied ones have several)
  };
  void point_slots_at_full();
  void adopt_replacements();
  void writeback_to_shards();
  void before_forward(nn::Module& m);

  std::vector<std::shared_ptr<FSDPState>> states_;
  std::vector<Held> held_;
  SummonOptions opts_;
  std::vector<nn::HookHandle> hooks_;
  nn::Module* forward_starter_ = nullptr;  // the outermost module of a forward inside the guard
  bool active_ = false;
};

}  // namespace weft::fsdp
