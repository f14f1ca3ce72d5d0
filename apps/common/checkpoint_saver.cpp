#include "apps/common/checkpoint_saver.h"

#include <cstdio>
#include <filesystem>
#include <fmt/format.h>

#include "apps/common/nonfinite.h"
#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_dir.h"

namespace weft::apps {

CheckpointSaver::CheckpointSaver(std::string program, CheckpointFlags flags, nn::Module& model, nn::Optimizer& opt,
                                 const fsdp::FSDPModule* root, const Ranks& ranks)
    : program_(std::move(program)), flags_(std::move(flags)), model_(model), opt_(opt), root_(root), ranks_(ranks) {}

namespace {
// The checkpoints beside `checkpoint` that its run wrote, with their recorded losses (none when its index or theirs do
// not read: the watch then starts from nothing, as a new run).
std::map<int64_t, CheckpointWatch::Recorded> run_history(const std::string& checkpoint) {
  std::map<int64_t, CheckpointWatch::Recorded> out;
  try {
    const std::string run = fsdp::read_checkpoint_index(checkpoint).training.run;
    for (auto& [step, path] : fsdp::complete_checkpoints(std::filesystem::path(checkpoint).parent_path()))
      if (const fsdp::CheckpointProgress p = fsdp::read_checkpoint_index(path.string()).training; !run.empty() && p.run == run)
        out[step] = {path.string(), p.loss};
  } catch (const std::exception&) {
    out.clear();
  }
  return out;
}
}  // namespace

void CheckpointSaver::resumed(const std::string& checkpoint, int64_t step) {
  watch_ = CheckpointWatch(checkpoint, step, run_history(checkpoint));
  last_ = checkpoint;
}

void CheckpointSaver::check_schedule(int64_t from, int64_t end) const {
  if (!enabled()) return;
  const std::string name = error_prefix(program_);
  dist::agree(ranks_.groups(), name, [&] {
    std::map<int64_t, std::filesystem::path> incomplete;
    fsdp::complete_checkpoints(flags_.dir, &incomplete);
    for (auto& [step, dir] : incomplete)
      WEFT_CHECK(step <= from || step > end || !due(step, end), "{}: {} is not a checkpoint (it has no index.json) and "
                 "this run would save step {} there: move it away first (nothing was trained)", name, dir.string(), step);
  });
}

bool CheckpointSaver::due(int64_t step, int64_t end) const {
  return enabled() && ((flags_.every > 0 && step % flags_.every == 0) || step == end);
}

void CheckpointSaver::save(const fsdp::CheckpointProgress& progress) {
  const std::string name = error_prefix(program_);
  std::string where;
  dist::agree(ranks_.groups(), name, [&] {
    // Never from non-finite state: the checkpoints already written stay as they are.
    const std::string refusing = fmt::format("{}: refusing to write a checkpoint at step {}", name, progress.step),
                      advice = fmt::format("; the existing checkpoints are untouched; {} — lower --lr", watch_.advice());
    check_finite_parameters(model_, refusing, advice);
    // Adam's second moment can overflow while the weights stay finite (a finite loss of 1e36): such state never resumes.
    const std::string bad = first_nonfinite(opt_.state_dict());
    WEFT_CHECK(bad.empty(), "{}: optimizer state {} is not finite{}", refusing, bad, advice);
    fsdp::CheckpointProgress mine = progress;
    mine.run = flags_.run;
    where = fsdp::save_checkpoint(flags_.dir, model_, &opt_, root_, mine,
                                  {.keep_last = flags_.keep_last, .keep_also = watch_.good(),
                                   .replace_other_runs = flags_.overwrite, .frozen_elsewhere = flags_.frozen_elsewhere});
  });
  last_ = where;
  saved_step_ = progress.step;
  watch_.saved(progress.step, where);
  if (!ranks_.lead()) return;
  std::fprintf(stderr, "saved model and optimizer at step %lld to %s\n", (long long)progress.step, where.c_str());
  watch_.announce_kept(program_, flags_.dir, flags_.keep_last);
}

}  // namespace weft::apps
