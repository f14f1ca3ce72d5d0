// apps: the op profiler's table (apps/common/op_table.h).
#include "apps/common/op_table.h"

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace weft::apps {

void print_op_table(int64_t steps, double step_ms, const std::function<double(const op_profiler::Row&)>& limit_percent) {
  const bool limits = bool(limit_percent);
  std::printf("| op | calls/step | ms/step | %% of step | GFLOP/s | GB/s |%s\n|---|---:|---:|---:|---:|---:|%s\n",
              limits ? " % of limit |" : "", limits ? "---:|" : "");
  double op_ms = 0, rest_ms = 0;
  for (const op_profiler::Row& r : op_profiler::rows()) {
    const double ms = 1e3 * r.seconds / double(steps);
    op_ms += ms;
    if (ms < 0.001 * step_ms) {
      rest_ms += ms;
      continue;
    }
    const std::string gflops = r.flops > 0 ? fmt::format("{:.1f}", r.flops / r.seconds / 1e9) : "-";
    const std::string limit = limits ? fmt::format(" {:.0f} |", limit_percent(r)) : "";
    std::printf("| %s | %.0f | %.2f | %.1f | %s | %.1f |%s\n", r.name.c_str(), double(r.calls) / double(steps), ms,
                100 * ms / step_ms, gflops.c_str(), r.bytes / r.seconds / 1e9, limit.c_str());
  }
  const char* blank = limits ? " |" : "";
  std::printf("| ops under 0.1%% each | | %.2f | %.1f | | |%s\n", rest_ms, 100 * rest_ms / step_ms, blank);
  std::printf("| framework (outside every op) | | %.2f | %.1f | | |%s\n", step_ms - op_ms,
              100 * (step_ms - op_ms) / step_ms, blank);
}

void StepProfile::start_step(int64_t step) {
  if (first_ <= 0 || step < first_) return;
  if (steps_ == 0) first_profiled_ = step;  // after --resume past `first`, the resumed step
  op_profiler::start(/*keep_rows=*/steps_ > 0);
  t0_ = std::chrono::steady_clock::now();
}

void StepProfile::end_step() {
  if (!op_profiler::active()) return;
  op_profiler::stop();
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  ++steps_;
}

void StepProfile::print() const {
  if (steps_ == 0) return;
  std::printf("# per-op profile of steps %lld-%lld (the calling thread's ops; a step %.1f ms on average)\n",
              (long long)first_profiled_, (long long)(first_profiled_ + steps_ - 1), 1e3 * seconds_ / double(steps_));
  print_op_table(steps_, 1e3 * seconds_ / double(steps_));
}

}  // namespace weft::apps
