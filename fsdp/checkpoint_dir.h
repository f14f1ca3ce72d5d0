// fsdp (internal): the directory a checkpoint lives in, and how one becomes visible. The
// pieces are written to DIR/.tmp-step_<step>, fsync'ed, and the finished directory renamed
// to DIR/step_<step> in one step, so a crash at any point leaves every earlier checkpoint
// valid and never a half-written one under a step_* name; keep_last then removes the oldest.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "checkpoint.h"

namespace weft::fsdp {

// step_<step, 8 digits>: where step `step`'s checkpoint is published under DIR.
std::string checkpoint_step_dir(int64_t step);
// .tmp-step_<step>: where it is written first.
std::string checkpoint_temp_dir(int64_t step);

// Complete checkpoints (step_* holding an index) directly under `dir`, by step; `incomplete`, when given, gets the
// step_* directories without one (weft publishes a step only with its index: one cut short or edited by hand).
std::map<int64_t, std::filesystem::path> complete_checkpoints(const std::filesystem::path& dir,
                                                              std::map<int64_t, std::filesystem::path>* incomplete = nullptr);

// Moves the finished `tmp` to `final_dir` (replacing a checkpoint of the same step, which is removed only after),
// fsync'ing both directories; removes the leftovers of saves that stopped before publishing (.tmp-/.old-step_N) for
// steps up to this one; then rotates the checkpoints of run `run` beside it as SaveOptions says (keep_last, the best
// recorded loss, keep_also, replace_other_runs), never removing `final_dir` itself.
void publish_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir,
                        const SaveOptions& options, const std::string& run);

}  // namespace weft::fsdp
