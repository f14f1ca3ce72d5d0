// apps: when and how the training loop writes checkpoints. One CheckpointSaver per run: it writes fsdp::save_checkpoint
// directories (every rank its shards, rank 0 the index) at the steps --checkpoint-every names and at the run's last
// step, never from non-finite parameters, rotates with --keep-last while sparing the newest checkpoint known to resume
// (CheckpointWatch), and remembers the newest checkpoint written or resumed from for the messages that name it.
#pragma once
#include <cstdint>
#include <string>

#include "apps/common/checkpoint_watch.h"
#include "apps/common/ranks.h"
#include "fsdp/fsdp.h"
#include "nn/module.h"
#include "nn/optimizer.h"

namespace weft::apps {

struct CheckpointFlags {
  std::string dir;   // empty: no checkpoints
  std::string flag;  // the flag that named it ("--checkpoint-dir", "--save"), for messages
  int64_t every = 0;  // 0: only at the run's last step
  int keep_last = 0;  // 0: keep all
  std::string run;    // the run identity its checkpoints record (checkpoint_owner.h)
  bool overwrite = false;  // --overwrite-checkpoints: the first save removes other runs' checkpoints
  bool frozen_elsewhere = false;  // frozen parameters are not written (a LoRA run's base: its own files)
};

class CheckpointSaver {
 public:
  CheckpointSaver(std::string program, CheckpointFlags flags, nn::Module& model, nn::Optimizer& opt,
                  const fsdp::FSDPModule* root, const Ranks& ranks);
  // The run continues from `checkpoint`, written after `step`.
  void resumed(const std::string& checkpoint, int64_t step);
  // Refuses, before a run from `from` to `end` trains, a save it would make into a step_N that is not a checkpoint.
  void check_schedule(int64_t from, int64_t end) const;
  bool enabled() const { return !flags_.dir.empty(); }
  // Whether a step that ends at `step` of a run ending at `end` writes a checkpoint.
  bool due(int64_t step, int64_t end) const;
  bool saved(int64_t step) const { return saved_step_ == step; }
  // Writes `progress` (its step, loss, data position and description) with the model and the
  // optimizer; a collective call on every rank.
  void save(const fsdp::CheckpointProgress& progress);
  // The newest checkpoint written or resumed from ("" when none).
  const std::string& last() const { return last_; }
  const CheckpointFlags& flags() const { return flags_; }
  CheckpointWatch& watch() { return watch_; }

 private:
  std::string program_;
  CheckpointFlags flags_;
  nn::Module& model_;
  nn::Optimizer& opt_;
  const fsdp::FSDPModule* root_;
  const Ranks& ranks_;
  CheckpointWatch watch_{"", 0};
  std::string last_;
  int64_t saved_step_ = -1;  // the step of the last checkpoint this run wrote
};

}  // namespace weft::apps
