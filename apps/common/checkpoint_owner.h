// apps: which training run owns a checkpoint directory. Every checkpoint a training app writes records its run's
// identity (fsdp::CheckpointProgress::run: when, where and by which process the run started); a run that resumes keeps
// the identity of the checkpoint it resumed from. A run writes only to a directory that holds no other run's
// checkpoints, so that neither its steps nor its --keep-last rotation replace another run's, and --resume DIR never
// continues the wrong run. See docs/CHECKPOINTS.md ("Run ownership").
#pragma once
#include <string>

namespace weft::apps {

// The identity a run records: that of the checkpoint it resumes from (`resume_from`, "" when that
// records none), else a new one: "<UTC start time> <host> pid <pid>".
std::string run_identity(const std::string& resume_from);

// Throws unless every complete checkpoint in `dir` (given by `flag`) was written by run `run` at a step up to that of
// `resume_from`, the checkpoint it resumes from ("": a new run): "<program>: <flag> <dir> holds checkpoints of another
// run (...): use --resume <dir> ..., or another directory, or <overwrite_flag> to replace them"; this run's of later
// steps (a run resumed from an earlier step) are refused too, since `--resume <dir>` would take them. With `overwrite`
// it says on stderr that those checkpoints will be replaced (SaveOptions::replace_other_runs at the first save).
// Checkpoints whose index cannot be read belong to no run and do not count.
void check_checkpoint_owner(const std::string& dir, const std::string& flag, const std::string& run,
                            const std::string& resume_from, bool overwrite, const std::string& resume_flag,
                            const std::string& program);

inline constexpr const char* kOverwriteCheckpointsFlag = "--overwrite-checkpoints";

}  // namespace weft::apps
