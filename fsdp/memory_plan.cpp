#include "fsdp/memory_plan.h"

#include <fmt/format.h>

#include <set>

#include "core/allocator.h"
#include "core/error.h"
#include "core/generator.h"
#include "dist/fake_group.h"
#include "kernels/rope.h"

namespace weft::fsdp {
namespace {

// Which part of the peak an owner's bytes are (the owner names of core, autograd, nn and fsdp).
void classify(PeakParts& parts, std::set<std::string>& groups, const std::string& owner, int64_t bytes) {
  auto starts = [&](std::string_view p) { return owner.starts_with(p); };
  if (starts("fsdp shards of") || starts("parameter '")) {
    parts.shards += bytes;
  } else if (starts("fsdp sharded gradients of") || owner == "gradients") {
    parts.gradients += bytes;
  } else if (owner.ends_with(" state")) {
    parts.optimizer_state += bytes;
  } else if (starts("fsdp all-gather of") || starts("fsdp unsharded parameters of") || starts("fsdp kept chunk")) {
    parts.unsharded += bytes;
    groups.insert(owner.substr(owner.rfind(" of '") + 4));
  } else if (starts("forward of ")) {
    parts.activations += bytes;
  } else {
    parts.temporary += bytes;
  }
}

}  // namespace

std::string describe(const PlanSettings& s) {
  int kept = 0;
  for (bool r : s.reshard_after_forward) kept += r ? 0 : 1;
  return fmt::format("reshard_after_forward false for {} of {} groups, activation checkpointing {}", kept,
                     s.reshard_after_forward.size(), nn::checkpointing_name(s.activation_checkpointing));
}

namespace {

// Sets up and runs the training step on the meta device; the peak and its parts.
MemoryPlan run_plan(const MemoryPlanRequest& r, const PlanSettings& settings) {
  const Device meta = Device::meta();
  MetaComputeGuard shapes_only;
  DefaultDeviceGuard on_meta(meta);
  kernels::forget_rope_tables(meta);  // allocated in this run's step, as the run's are in its first
  start_owner_accounting(meta);
  OwnerPeak peak;
  std::vector<step_trace::Event> trace;
  // What the step keeps on the host (the optimizer's step counts, as PyTorch keeps them) is the trained device's
  // memory when that is the CPU: held from the first step on, so part of the peak.
  int64_t host_state = memory_stats(kCPU).live_bytes, load = 0, model = 0;
  try {
    TrainingStep step = r.setup(settings, r.sharded ? dist::fake_mesh(0, r.world_size) : nullptr);
    load = r.load_bytes ? r.load_bytes() : 0;
    model = memory_stats(meta).live_bytes;
    // Building the model on meta is not part of training: count from its shards on.
    reset_owner_accounting_peak(meta);
    for (int i = 0; i + 1 < r.steps; ++i) step();
    if (r.record_step) step_trace::start();  // the steady state's step, for the step-time model
    step();
    if (r.record_step) trace = step_trace::stop();
    peak = stop_owner_accounting(meta);
    host_state = r.device.is_cpu() ? memory_stats(kCPU).live_bytes - host_state : 0;
  } catch (...) {
    step_trace::stop();
    stop_owner_accounting(meta);
    throw;
  }
  MemoryPlan plan;
  plan.step = std::move(trace);
  plan.world_size = r.sharded ? r.world_size : 1;
  plan.settings = settings;
  plan.peak_bytes = peak.peak_bytes;
  plan.peak_at = peak.at.empty() ? "an allocation outside the modules' scopes (e.g. the loss)" : peak.at;
  std::set<std::string> groups;
  for (auto& [owner, bytes] : peak.by_owner) classify(plan.parts, groups, owner, bytes);
  plan.parts.groups_in_flight = int(groups.size());
  plan.peak_bytes += host_state;
  plan.parts.optimizer_state += host_state;
  if (model + load > plan.peak_bytes)  // reading the model's values peaks above training
    plan.peak_bytes = model + load, plan.peak_at = "loading the model's values", plan.parts = {.shards = model, .temporary = load};
  plan.budget = r.budget;
  plan.fits = !r.budget || plan.peak_bytes <= *r.budget;
  return plan;
}

}  // namespace

MemoryPlan plan_memory(const MemoryPlanRequest& r) {
  WEFT_CHECK(bool(r.setup), "plan_memory: the request has no setup (the function that builds, shards and trains)");
  WEFT_CHECK(r.world_size >= 1, "plan_memory: world_size must be at least 1, got {}", r.world_size);
  WEFT_CHECK(r.steps >= 1, "plan_memory: steps must be at least 1, got {}", r.steps);
  WEFT_CHECK(!r.budget || *r.budget > 0, "plan_memory: the budget must be positive, got {}", r.budget.value_or(0));
  WEFT_CHECK(r.tunable_groups >= 0 && (r.settings.reshard_after_forward.empty() ||
                                       int(r.settings.reshard_after_forward.size()) == r.tunable_groups),
             "plan_memory: settings give reshard_after_forward for {} groups, the request has {} tunable groups",
             r.settings.reshard_after_forward.size(), r.tunable_groups);
  // Planning builds models and draws nothing, but initialisation rules take offsets from the
  // default generator: the real run must see it as it was.
  Generator& gen = default_generator();
  const Generator::State rng = gen.state();
  std::vector<std::string> tried;
  auto run = [&](const PlanSettings& s) {
    MemoryPlan p = run_plan(r, s);
    gen.set_state(rng);
    tried.push_back(fmt::format("{}: peak {}{}", describe(s), format_mib(p.peak_bytes),
                                r.budget ? (p.fits ? " (fits)" : " (over the budget)") : ""));
    return p;
  };
  const int n = r.sharded ? r.tunable_groups : 0;
  MemoryPlan out;
  if (!r.budget) {
    PlanSettings s = r.settings;
    if (s.reshard_after_forward.empty()) s.reshard_after_forward.assign(size_t(n), true);
    out = run(s);
  } else {
    // Fastest first: no recomputation before it, and of each, the most groups kept gathered from forward to backward
    // (no second all-gather). Keeping the last k groups (those backward reaches first) costs more memory as k grows, so
    // k is found by bisection. What the caller fixed is not searched.
    std::optional<MemoryPlan> smallest;
    std::vector<nn::Checkpointing> acs{nn::Checkpointing::none, nn::Checkpointing::selective, nn::Checkpointing::full};
    if (r.fixed_checkpointing) acs = {*r.fixed_checkpointing};
    const int searched = r.fixed_reshard ? 0 : n;
    for (nn::Checkpointing ac : acs) {
      if (ac != nn::Checkpointing::none && !r.can_checkpoint && !r.fixed_checkpointing) break;
      auto settings_for = [&](int k) {
        PlanSettings s;
        s.activation_checkpointing = ac;
        for (int g = 0; g < n; ++g) s.reshard_after_forward.push_back(r.fixed_reshard ? *r.fixed_reshard : g < n - k);
        return s;
      };
      MemoryPlan least = run(settings_for(0));
      if (!least.fits) {
        if (!smallest || least.peak_bytes < smallest->peak_bytes) smallest = least;
        continue;
      }
      MemoryPlan best = least;
      if (searched > 0) {
        MemoryPlan all = run(settings_for(searched));
        if (all.fits) {
          best = all;
        } else {
          int lo = 0, hi = searched;  // lo fits, hi does not
          while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            MemoryPlan p = run(settings_for(mid));
            if (p.fits) lo = mid, best = p;
            else hi = mid;
          }
        }
      }
      smallest = best;
      break;
    }
    out = *smallest;
  }
  out.tried = std::move(tried);
  out.ranks = !r.ranks.empty() ? r.ranks : fmt::format("{} rank{}", out.world_size, out.world_size == 1 ? "" : "s");
  return out;
}

std::string MemoryPlan::table() const {
  std::string t = fmt::format("memory plan per rank at {}: {}\n", ranks,
                              describe(settings));
  auto row = [&](const char* what, int64_t bytes, const std::string& note = "") {
    t += fmt::format("  {:<34} {:>12} {:>14}{}\n", what, format_mib(bytes), bytes, note);
  };
  row("parameters (this rank's shards)", parts.shards);
  row("gradients", parts.gradients);
  row("optimizer state", parts.optimizer_state);
  row("unsharded groups in flight", parts.unsharded, fmt::format("  ({} groups)", parts.groups_in_flight));
  row("activations", parts.activations);
  row("temporary buffers", parts.temporary);
  row("predicted peak", peak_bytes, peak_at.empty() ? "" : "  (reached in " + peak_at + ")");
  if (budget)
    t += fmt::format("  budget {} ({} bytes): {}\n", format_mib(*budget), *budget,
                     fits ? fmt::format("fits, {} to spare", format_mib(*budget - peak_bytes))
                          : fmt::format("does NOT fit: over by {} ({} bytes) even with the settings above",
                                        format_mib(peak_bytes - *budget), peak_bytes - *budget));
  if (tried.size() > 1) {
    t += "  plans tried:\n";
    for (auto& line : tried) t += "    " + line + "\n";
  }
  return t;
}

}  // namespace weft::fsdp
