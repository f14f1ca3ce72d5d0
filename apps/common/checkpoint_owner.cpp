#include "apps/common/checkpoint_owner.h"

#include <cstdio>
#include <map>
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

// "run R, steps A to B, <model>" for the checkpoints of one other run (`app`: its newest's description): what a
// user needs to know which run the directory holds.
std::string describe_run(const std::map<std::string, std::string>& app, const std::string& run, int64_t first,
                         int64_t last) {
  std::string model;
  for (const char* key : {"format", "arch", "model", "n_layer", "d_model", "seed"})
    if (auto it = app.find(key); it != app.end()) model += fmt::format(", {} {}", key, it->second);
  const std::string steps = first == last ? fmt::format("step {}", first) : fmt::format("steps {} to {}", first, last);
  return fmt::format("{}, {}{}", run.empty() ? "a run that recorded no identity" : "run " + run, steps, model);
}

}  // namespace

void check_checkpoint_owner(const std::string& dir, const std::string& flag, const std::string& run,
                            const std::string& resume_from, bool overwrite, const std::string& resume_flag,
                            const std::string& program) {
  const int64_t resumed_step = resume_from.empty() ? -1 : fsdp::read_checkpoint_index(resume_from).training.step;
  // Other runs' checkpoints; this run's past the step it resumes from.
  struct Found { int64_t first = -1, last = -1, count = 0; std::string run, newest; } other, later;
  for (auto& [step, ck] : fsdp::checkpoint_runs(dir)) {
    if (ck.run == run && step <= resumed_step) continue;
    Found& f = ck.run == run ? later : other;
    if (f.first < 0) f.first = step;
    f.last = step, f.run = ck.run, f.newest = ck.path, ++f.count;
  }
  for (const Found* f : {&other, &later}) {
    if (f->count == 0) continue;
    std::map<std::string, std::string> app;  // (none when the index does not read)
    try { app = fsdp::read_checkpoint_index(f->newest).training.app; } catch (const Error&) {}
    const std::string who = describe_run(app, f->run, f->first, f->last);
    const bool ours = !app.count("format") || app.at("format") == "weft-" + program;  // else another program's run
    const std::string what = f == &other ? "checkpoints of another run (" + who + ")" : fmt::format(
        "checkpoints of this run past step {}, which it resumes from ({}: {} {} would take them)", resumed_step, who,
        resume_flag, dir);
    const std::string advice = f != &other ? "move them away, or another directory" : !ours ? "another program's: give "
        "another directory" : "use " + resume_flag + " " + dir + " to continue that run, or another directory";
    WEFT_CHECK(overwrite, "{}: {} {} holds {}: {}, or {} to replace them", program, flag, dir, what, advice,
               kOverwriteCheckpointsFlag);
    std::fprintf(stderr, "weft-%s: %s %s holds %lld %s: %s replaces them at this run's first save\n", program.c_str(),
                 flag.c_str(), dir.c_str(), (long long)f->count, what.c_str(), kOverwriteCheckpointsFlag);
  }
}

}  // namespace weft::apps
