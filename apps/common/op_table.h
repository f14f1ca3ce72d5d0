// apps: the op profiler's rows (core/op_profiler.h) as a Markdown table: per op, calls and milliseconds per step, its
// share of the step, its rates and, where the caller knows the op's limit, the rate as a share of it; then the small
// ops together and "framework", the step's time outside every op (autograd, allocation, module code).
// weft-transformer's `--profile` and weft-bench-gpt2's print it.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>

#include "core/op_profiler.h"

namespace weft::apps {

// `steps` steps of `step_ms` (their mean) each; ops under 0.1 % of the step are summed in one
// row. `limit_percent`, when given, adds the "% of limit" column.
void print_op_table(int64_t steps, double step_ms,
                    const std::function<double(const op_profiler::Row&)>& limit_percent = {});

// Profiles the steps from `first` (1-based) to the end of a run: start_step() and end_step() around each step (the time
// between steps, evaluations and saves, is left out of both the rows and the step time); print() prints the table.
class StepProfile {
 public:
  explicit StepProfile(int64_t first) : first_(first) {}
  void start_step(int64_t step);  // `step`: the one about to run (1-based)
  void end_step();
  void print() const;  // nothing if no step was profiled

 private:
  int64_t first_, first_profiled_ = 0, steps_ = 0;
  double seconds_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace weft::apps
