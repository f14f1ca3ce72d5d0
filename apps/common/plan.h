// apps: the memory planner's flags in the training apps (fsdp::plan_memory). --plan prints the predicted peak per rank
// and its parts and ends the run; --plan-ranks N plans for N ranks from one process; --memory-budget BYTES makes the
// planner choose reshard_after_forward per group and activation checkpointing so that training fits, and the run then
// trains with them (or stops before training, saying by how much it cannot fit). weft-plan APP ... is APP's --plan.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "apps/common/ranks.h"
#include "apps/common/step_time.h"
#include "fsdp/memory_plan.h"

namespace weft::apps {

struct PlanFlags {
  bool plan = false;
  int ranks = 0;       // 0: the ranks of this run
  std::string budget;  // a byte count as WEFT_MEMORY_LIMIT takes it; empty: none
  StepTimeFlags step_time;
  bool modelled = true;  // the app's settings are ones its plan models (else no plan is made unasked)
  std::string lighter = "a smaller --batch-size (with --grad-accum to keep the batch), activation checkpointing (--ac)";
  bool wanted() const { return plan || ranks > 0 || !budget.empty(); }
  bool only() const { return plan || ranks > 0; }  // print the plan and stop
};

void add_plan_flags(CLI::App& cmd, PlanFlags& flags);
// The plan flags every rank must share (dist::check_same_config): --step-time and its networks change which
// collectives a rank issues (a rank measuring the network alone waited in them till the timeout).
dist::ConfigSettings plan_settings(const PlanFlags& flags);

// The ranks a run plans for or has, for messages: "the 4 ranks of --plan-ranks (weft-plan's --ranks)",
// "the 2 ranks of mpirun", or "the 1 rank of this process (...how to plan for more)".
std::string ranks_text(const PlanFlags& flags, int world);

// When the flags ask for a plan: fills in the world size and the budget (less what `device`
// holds already) and plans; rank 0 prints the table (to stdout under --plan), and with
// --step-time the predicted step (apps/common/step_time.h) training on `per_step`. A budget
// that no setting meets is an error naming the shortfall. Without plan flags: nothing (nullopt).
std::optional<fsdp::MemoryPlan> plan_from_flags(const PlanFlags& flags, fsdp::MemoryPlanRequest request,
                                                const Ranks& ranks, Device device, const StepItems& per_step,
                                                const std::string& program);

// Rank 0 prints the largest peak over the ranks of device memory above `start` (the live bytes
// before the model was built), beside the plan's prediction if there was one.
void report_peak_memory(const std::string& program, Device device, int64_t start, const Ranks& ranks,
                        const std::optional<fsdp::MemoryPlan>& plan);

}  // namespace weft::apps
