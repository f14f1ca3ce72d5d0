#include "apps/common/checkpoint_owner.h"

#include <cstdio>
#include <ctime>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include "core/error.h"
#include "fsdp/fsdp.h"

namespace weft::apps {

std::string run_identity(const std::string& resume_from) {
  if (!resume_from.empty()) return fsdp::read_checkpoint_index(resume_from).training.run;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);  // best effort: the time and pid still tell runs apart
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ} {} pid {}", fmt::gmtime(std::time(nullptr)), host, ::getpid());
}

namespace {

// "run R, steps A to B, <model>" for the checkpoints of one other run: what a user needs to know
// which run the directory holds.
std::string describe_run(const std::string& newest, const std::string& run, int64_t first, int64_t last) {
  std::string model;
  try {
    const auto app = fsdp::read_checkpoint_index(newest).training.app;
    for (const char* key : {"format", "arch", "model", "n_layer", "d_model", "seed"})
      if (auto it = app.find(key); it != app.end()) model += fmt::format(", {} {}", key, it->second);
  } catch (const Error&) {
  }
  const std::string steps = first == last ? fmt::format("step {}", first) : fmt::format("steps {} to {}", first, last);
  return fmt::format("{}, {}{}", run.empty() ? "a run that recorded no identity" : "run " + run, steps, model);
}

}  // namespace

void check_checkpoint_owner(const std::string& dir, const std::string& flag, const std::string& run, bool overwrite,
                            const std::string& resume_flag, const std::string& program) {
  int64_t first = -1, last = -1, count = 0;
  std::string other, newest;
  for (auto& [step, ck] : fsdp::checkpoint_runs(dir)) {
    if (ck.run == run) continue;
    if (first < 0) first = step;
    last = step;
    other = ck.run;  // the newest other run's
    newest = ck.path;
    ++count;
  }
  if (count == 0) return;
  const std::string who = describe_run(newest, other, first, last);
  if (overwrite) {
    std::fprintf(stderr, "weft-%s: %s %s holds %lld checkpoint(s) of another run (%s): %s replaces them at this run's "
                 "first save\n", program.c_str(), flag.c_str(), dir.c_str(), (long long)count, who.c_str(),
                 kOverwriteCheckpointsFlag);
    return;
  }
  WEFT_ERROR("{}: {} {} holds checkpoints of another run ({}): use {} {} to continue that run, or another "
             "directory, or {} to replace them", program, flag, dir, who, resume_flag, dir, kOverwriteCheckpointsFlag);
}

}  // namespace weft::apps
