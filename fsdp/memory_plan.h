// fsdp: the memory planner. Predicts a rank's peak memory of training before anything runs, by running the training
// step itself on the meta device: the model is built there (deferred), sharded over a fake mesh of N ranks
// (dist/fake_group.h) and trained for a few steps under a MetaComputeGuard, so every tensor the real step would
// allocate (shards, gathered groups, activations from the real graph, gradients, optimizer state, communication
// buffers) is counted by the meta allocator without holding memory. The peak is split by owner (core/allocator.h's
// owner accounting). Given a budget, it searches the settings FSDP offers (reshard_after_forward per group, activation
// checkpointing: none, then selective, then full) for the fastest that fits. See docs/FSDP.md ("Memory planner") and
// docs/MEMORY_SCALING.md (predicted beside measured).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/step_trace.h"
#include "../dist/device_mesh.h"
#include "../nn/activation_checkpoint.h"

namespace weft::fsdp {

// What the planner may change.
struct PlanSettings {
  // reshard_after_forward of each tunable group, in the caller's order (e.g. the blocks): true
  // frees the group's gathered parameters after its forward, false keeps them for backward.
  std::vector<bool> reshard_after_forward;
  // Of the tunable modules (the blocks): none, selective (kept GEMM and attention outputs,
  // element-wise ops recomputed) or full.
  nn::Checkpointing activation_checkpointing = nn::Checkpointing::none;
};

// One training step of the caller's own code, set up with given settings: `setup` builds the model (it runs under a
// DefaultDeviceGuard on the meta device), shards it over `mesh` (null: leave it unsharded) applying `settings`, makes
// its optimizer and returns a function that runs one step on meta inputs (forward and backward of every micro-batch,
// gradient clipping, the optimizer step, zero_grad). The step owns the model and optimizer.
using TrainingStep = std::function<void()>;
using StepSetup = std::function<TrainingStep(const PlanSettings&, const std::shared_ptr<dist::DeviceMesh>& mesh)>;

struct MemoryPlanRequest {
  StepSetup setup;
  int world_size = 1;      // ranks the model is sharded over
  std::string ranks;       // how the table names the ranks ("4 ranks (2 data-parallel x tp 2)"); "": world_size's
  bool sharded = true;     // false: one process, no fully_shard (mesh is null)
  int tunable_groups = 0;  // the size of PlanSettings::reshard_after_forward
  bool can_checkpoint = false;  // whether the search may turn activation checkpointing on (selective, then full)
  PlanSettings settings;   // what is planned without a budget
  std::optional<int64_t> budget;  // bytes per rank (above what is live before training)
  // What the caller fixed (its user chose): a budget's search keeps it and chooses only the rest.
  std::optional<nn::Checkpointing> fixed_checkpointing;
  std::optional<bool> fixed_reshard;  // every tunable group's reshard_after_forward
  // Called after setup: what reading the model's values from files holds at once beside the model as set up (e.g.
  // fsdp::external_load_bytes); the peak is at least the two together. None: the values are not read.
  std::function<int64_t()> load_bytes;
  Device device = kCPU;    // where the run trains: what the step keeps on the host counts only on the CPU
  int steps = 2;           // optimizer state appears in the first step; the second is the steady state
  bool record_step = false;  // keep the last step's trace in MemoryPlan::step (for the step-time model)
};

// The bytes live on a rank at its peak, by what holds them.
struct PeakParts {
  int64_t shards = 0;           // this rank's parameters (their shards under FSDP)
  int64_t gradients = 0;        // this rank's gradients (sharded under FSDP)
  int64_t optimizer_state = 0;  // e.g. AdamW's two moments
  int64_t unsharded = 0;        // gathered parameter groups in flight
  int64_t activations = 0;      // saved by forwards for backward
  int64_t temporary = 0;        // backward's gradient buffers, communication buffers, the rest
  int groups_in_flight = 0;
};

struct MemoryPlan {
  int world_size = 1;
  std::string ranks;  // the request's, or "N rank(s)"
  PlanSettings settings;
  int64_t peak_bytes = 0;  // predicted peak per rank
  std::string peak_at;     // the owner of the allocation that reaches the peak
  PeakParts parts;
  std::optional<int64_t> budget;
  bool fits = true;                // peak <= budget (true without one)
  std::vector<std::string> tried;  // the search, one line per plan run
  std::vector<step_trace::Event> step;  // with record_step: what the last step ran, in order (fsdp/step_time.h)
  // A table of the peak's parts, the settings and, with a budget, whether it fits.
  std::string table() const;
};

// "reshard_after_forward false for K of N groups, activation checkpointing AC".
std::string describe(const PlanSettings& settings);

MemoryPlan plan_memory(const MemoryPlanRequest& request);

}  // namespace weft::fsdp
