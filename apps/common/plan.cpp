#include "apps/common/plan.h"

#include <cstdio>

#include "apps/common/cli.h"
#include "apps/common/host_memory.h"

#include "core/allocator.h"
#include "core/tensor.h"
#include "dist/dist.h"

namespace weft::apps {

namespace {

// The bytes this rank can allocate without the kernel's OOM killer ending it: MemAvailable shared
// by the ranks on this host (0: unknown).
int64_t available_bytes() { return host_available_bytes() / (dist::is_initialized() ? dist::local_size() : 1); }

// A run whose planned peak is past the memory it can have would be killed mid-step (a batch too
// large): refused first. With WEFT_MEMORY_LIMIT set, the allocator's own limit stops it cleanly
// instead; on a GPU, the device's allocation errors do: whether MemAvailable is checked.
bool machine_checked(Device device) { return device.is_cpu() && memory_limit(device) <= 0 && available_bytes() > 0; }

// A plan whose peak is past the memory this rank can have is refused (the run would be killed mid-step); one that
// fits leaves the CPU block cache only what remains.
void check_peak_fits_machine(const fsdp::MemoryPlan& plan, int64_t held, const std::string& program, bool budget,
                             const std::string& lighter) {
  const int64_t available = available_bytes();
  const int local = dist::is_initialized() ? dist::local_size() : 1;
  WEFT_CHECK(plan.peak_bytes + held <= available, "{}: training would need about {} per rank (the memory plan's peak; "
             "activations {}), more than the {} this machine has available{} (MemAvailable): {}; WEFT_MEMORY_LIMIT=BYTES "
             "runs it under that limit instead", error_prefix(program), format_mib(plan.peak_bytes + held),
             format_mib(plan.parts.activations), format_mib(available), local > 1 ? fmt::format(" to each of its {} ranks", local) : "",
             budget ? "give a --memory-budget this machine has, so that the planner chooses within it"
                    : "use " + lighter + ", more ranks, or --memory-budget to let the planner choose");
  limit_cpu_block_cache(available - plan.peak_bytes - held);
}

// Without plan flags: the plan of the flags' settings, checked (the run goes on unplanned).
void check_fits_this_machine(const PlanFlags& f, fsdp::MemoryPlanRequest request, const Ranks& ranks, Device device,
                             const std::string& program) {
  if (!f.modelled || !machine_checked(device)) return;
  request.world_size = request.sharded ? ranks.data_world() : 1;
  check_peak_fits_machine(fsdp::plan_memory(request), memory_stats(device).live_bytes, program, false, f.lighter);
}

}  // namespace

void add_plan_flags(CLI::App& cmd, PlanFlags& f) {
  cmd.add_flag("--plan", f.plan, "print the memory plan (predicted peak per rank and its parts) and stop");
  cmd.add_option("--plan-ranks", f.ranks, "plan for N ranks from this one process (implies --plan; use with --fsdp)")
      ->check(cli::integer(1, 1 << 20));
  cmd.add_option("--memory-budget", f.budget,
                 "bytes per rank training may use (e.g. 900M): the planner picks reshard-after-forward per block and "
                 "activation checkpointing to fit, or stops saying by how much it cannot")
      ->check(cli::bytes());
  add_step_time_flags(cmd, f.step_time);
}

dist::ConfigSettings plan_settings(const PlanFlags& f) {
  return {{"--plan", f.plan ? "true" : "false"}, {"--plan-ranks", std::to_string(f.ranks)}, {"--memory-budget", f.budget},
          {"--step-time", f.step_time.wanted ? "true" : "false"}, {"--network", f.step_time.network},
          {"--tp-network", f.step_time.tp_network}};
}

std::string ranks_text(const PlanFlags& f, int world) {
  if (f.ranks > 0) return fmt::format("the {} rank{} of --plan-ranks (weft-plan's --ranks)", f.ranks, f.ranks == 1 ? "" : "s");
  if (world > 1) return fmt::format("the {} ranks of mpirun", world);
  return "the 1 rank of this process (run it under mpirun -np N, or plan for N ranks with --plan-ranks N, weft-plan's "
         "--ranks N)";
}

std::optional<fsdp::MemoryPlan> plan_from_flags(const PlanFlags& f, fsdp::MemoryPlanRequest request,
                                                const Ranks& ranks, Device device, const StepItems& per_step,
                                                const std::string& program) {
  WEFT_CHECK(!f.step_time.wanted || f.wanted(), "--step-time predicts the planned step: add --plan, --plan-ranks or --memory-budget");
  for (const auto& [flag, value] : {std::pair{"--network", &f.step_time.network}, {"--tp-network", &f.step_time.tp_network}})
    WEFT_CHECK(value->empty() || f.step_time.wanted, "{} is a network --step-time assumes: add --step-time", flag);
  WEFT_CHECK(f.step_time.tp_network.empty() || ranks.tp > 1, "--tp-network is the tensor-parallel groups' link: add --tp N");
  if (!f.wanted()) {
    check_fits_this_machine(f, request, ranks, device, program);
    return std::nullopt;
  }
  WEFT_CHECK(f.ranks == 0 || request.sharded, "memory plan: --plan-ranks plans sharded training: add --fsdp");
  // The ranks fully_shard shards over: the data-parallel ones (--tp splits each group's model).
  request.world_size = request.sharded ? (f.ranks > 0 ? f.ranks / ranks.tp : ranks.data_world()) : 1;
  if (request.sharded && ranks.tp > 1)
    request.ranks = fmt::format("{} ranks ({} data-parallel x tp {})", request.world_size * ranks.tp, request.world_size, ranks.tp);
  request.record_step = f.step_time.wanted;
  request.device = device;
  const int64_t held = memory_stats(device).live_bytes;
  int64_t budget = 0;
  if (!f.budget.empty()) {
    budget = parse_bytes(f.budget, "--memory-budget");
    WEFT_CHECK(budget > held, "memory plan: --memory-budget {} {}", f.budget, budget <= 0 ? "must be more than 0 bytes"
               : fmt::format("is not more than the {} bytes this rank holds before the model (the data)", held));
    request.budget = budget - held;
  }
  fsdp::MemoryPlan plan = fsdp::plan_memory(request);
  if (ranks.lead()) {
    std::FILE* out = f.only() ? stdout : stderr;
    std::fprintf(out, "%s: %s", program.c_str(), plan.table().c_str());
    if (held > 0) std::fprintf(out, "  (above the %lld bytes held before the model)\n", (long long)held);
    std::fflush(out);
  }
  WEFT_CHECK(plan.fits, "memory plan: training does not fit --memory-budget {} at {}: the smallest plan ({}) "
             "needs {} bytes per rank, {} more than the budget leaves after the {} bytes held before the model; use "
             "more ranks or a smaller model or batch{}", f.budget, plan.ranks,
             fsdp::describe(plan.settings), plan.peak_bytes, plan.peak_bytes - budget + held, held,
             request.fixed_checkpointing || request.fixed_reshard ? ", or leave the settings given by flag to the planner" : "");
  if (!f.only() && request.budget && machine_checked(device)) check_peak_fits_machine(plan, held, program, true, f.lighter);
  report_step_time(f.step_time, plan, ranks, f.ranks > 0 ? f.ranks : ranks.world, per_step, f.only() ? stdout : stderr,
                   program);
  return plan;
}

void report_peak_memory(const std::string& program, Device device, int64_t start, const Ranks& ranks,
                        const std::optional<fsdp::MemoryPlan>& plan) {
  int64_t peak = memory_stats(device).peak_bytes - start;
  if (ranks.fsdp) {
    Tensor t = from_vector({double(peak)}, {1}, {.dtype = kFloat64});
    dist::world()->all_reduce(t, dist::ReduceOp::max)->wait();
    peak = int64_t(t.item());
  }
  if (!ranks.lead()) return;
  std::fprintf(stderr, "%s: peak memory per rank %s (%lld bytes) above the start", program.c_str(),
               format_mib(peak).c_str(), (long long)peak);
  if (plan)
    std::fprintf(stderr, "; the plan predicted %lld bytes (%+.2f %%)", (long long)plan->peak_bytes,
                 100.0 * double(plan->peak_bytes - peak) / double(std::max<int64_t>(peak, 1)));
  std::fprintf(stderr, "\n");
}

}  // namespace weft::apps
