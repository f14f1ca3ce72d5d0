// apps: the step-time model's flags and its calibration on this machine (fsdp/step_time.h). With --step-time the memory
// plan's meta step is timed too: this machine's rate for each GEMM and attention shape the step runs (replayed on the
// CPU), the element-wise rate and the time the framework adds per op (a chain of autograd ops of the step's median
// size); the network is measured on the run's ranks under mpirun (all-gathers of two sizes fitted to the ring's cost),
// or stated with --network GBPS[,LATENCY_US] (e.g. 100,5; planning N ranks from one process needs it); --tp-network
// gives the tensor-parallel groups a link of their own (inside a node). Rank 0 prints the predicted step, its parts and
// tokens per second.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/ranks.h"
#include "dist/process_group.h"
#include "fsdp/memory_plan.h"
#include "fsdp/step_time.h"

namespace weft::apps {

struct StepTimeFlags {
  bool wanted = false;
  std::string network;     // "GBPS[,LATENCY_US]"; empty: measured on this run's ranks
  std::string tp_network;  // the tensor-parallel groups' own link; empty: `network`
};

void add_step_time_flags(CLI::App& cmd, StepTimeFlags& flags);

// "100" or "100,5": Gb/s and microseconds per hop (5 when left out); errors name `flag`.
fsdp::Link parse_network(const std::string& text, const std::string& flag = "--network");
// All-gathers over every rank of this run (a collective: call it on each).
fsdp::Link measure_link();
// Rates of the trace's ops on this machine; with `world` (every rank calling it on the same
// trace), timed with all ranks computing at once; element-wise ops on `working_bytes` of
// operands (the step's peak memory: as much of them fits the caches).
fsdp::ComputeRates calibrate_compute(const std::vector<step_trace::Event>& trace, const dist::ProcessGroupPtr& world,
                                     int64_t working_bytes);

// What one step trains on, for the rate: e.g. {16384, "tokens"}.
struct StepItems {
  double count = 0;
  std::string what = "samples";
};

// When --step-time was given: calibrates (a collective under mpirun: every rank calls it),
// predicts the plan's step, and rank 0 prints it to `out` with the items per second.
void report_step_time(const StepTimeFlags& flags, const fsdp::MemoryPlan& plan, const Ranks& ranks, int planned_ranks,
                      const StepItems& per_step, std::FILE* out, const std::string& program);

}  // namespace weft::apps
