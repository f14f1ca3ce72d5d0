// fsdp: checkpoint directories. Every rank writes its own pieces of the model and optimizer (a sharded state dict, no
// gathering) to one safetensors file per shard, and rank 0 writes an index (index.json): world size, mesh, every
// tensor's global shape, dtype, placement and the files holding its pieces, the training step, RNG states, data-loader
// position, weft's version and each file's sha256. Loading works at any world size: each rank reads only the pieces
// that overlap its own shards. See docs/CHECKPOINTS.md.
//
//   DIR/step_00000100/index.json
//   DIR/step_00000100/rank_00000.safetensors ... rank_<N-1>.safetensors
//
// A checkpoint is written to DIR/.tmp-step_<step> (files fsync'ed) and renamed into place only when complete, so a
// crash leaves the previous checkpoints valid; keep_last removes the oldest but never the one with the best recorded
// loss. A training run claims its directory first (CheckpointDirLock): a second run writing to it is refused, naming
// the first. The directory must be visible to every rank (a shared filesystem across hosts).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../core/generator.h"
#include "sharded_state_dict.h"

namespace weft::fsdp {

// What a training loop restores besides the model, the optimizer and the RNG.
struct CheckpointProgress {
  int64_t step = 0;  // optimizer steps taken (an LR schedule resumes from it)
  std::map<std::string, int64_t> data;        // data-loader position in the app's terms (e.g. epoch, batch)
  std::map<std::string, std::string> app;     // the app's description (format, model config); copied into
                                              // the metadata of consolidated files
  std::map<std::string, std::string> aliases;  // extra names a consolidated file repeats: name -> parameter
                                               // (e.g. nanoGPT's lm_head.weight for a tied head)
  std::optional<double> loss;  // the training loss logged at `step` (NaN and infinity kept as such)
  std::string run;  // the training run that wrote it (an app's run identity, kept on resume); "": none recorded
};

struct SaveOptions {
  // Keep only the K newest complete checkpoints under the directory (0: all) and, besides them, the one with the lowest
  // finite recorded loss (the newest of equals) and the one before it (whose weights gave that loss, logged before its
  // step's update), so that a diverging run cannot rotate away every checkpoint it wrote before diverging.
  int keep_last = 0;
  // A checkpoint keep_last must not remove either (a trainer's newest checkpoint known to resume).
  std::string keep_also;
  // keep_last counts and removes only the checkpoints of this save's run (CheckpointProgress::run):
  // it never touches another run's. With replace_other_runs, the complete checkpoints of every
  // other run (and those whose index cannot be read) are removed once this one is published, and
  // this run's of later steps (those of steps a run resumed from an earlier one leaves behind).
  bool replace_other_runs = false;
  // Frozen parameters (requires_grad false: a LoRA run's base, kept in files of its own) are not
  // written; loading such a checkpoint needs LoadOptions::frozen_elsewhere.
  bool frozen_elsewhere = false;
};

// Writes `dir`/step_<step>/ (replacing a checkpoint of the same step) and returns its path. A
// collective call on every rank of root's mesh (under HSDP, replica 0's ranks write the
// files); `root` null: an unsharded model written by this process alone. `opt` may be null.
// A failure on any rank fails every rank and leaves the earlier checkpoints as they were.
std::string save_checkpoint(const std::string& dir, nn::Module& model, const nn::Optimizer* opt,
                            const FSDPModule* root, const CheckpointProgress& state, const SaveOptions& options = {});

// Throws naming the entry when a string of `state` cannot be written into index.json (JSON holds UTF-8 text only: a
// path with another byte, say). save_checkpoint checks first; a program checks before it trains, not at its first save.
void check_recordable(const CheckpointProgress& state);

// `path` itself when it is a checkpoint (holds index.json), else the complete step_* under it with the highest step
// whose index reads; empty when there is none. Newer ones whose index cannot be read are passed over, each adding its
// error (which names it) to `unreadable` when given, as does every step_* directory without an index.
std::string latest_checkpoint(const std::string& path, std::vector<std::string>* unreadable = nullptr);

// Each complete checkpoint under `dir` by step: its path and the run its index records ("" for
// none); checkpoints whose index cannot be read are left out.
struct CheckpointOfRun {
  std::string path, run;
};
std::map<int64_t, CheckpointOfRun> checkpoint_runs(const std::string& dir);

// The complete checkpoints under `dir` older than its `keep_last` newest (none when keep_last is
// 0): after a save with keep_last, those it kept for their loss or as keep_also.
std::vector<std::string> older_kept_checkpoints(const std::string& dir, int keep_last);

// Held by the one process of a training run that writes `dir` (rank 0 of the job): an exclusive lock on DIR/.lock
// (flock, released when the process ends, however it ends) holding the holder's host, pid and start time. Claiming a
// directory another live process holds throws a weft::Error naming that holder; once claimed, the leftovers of saves
// that were killed before publishing (.tmp-step_*, .old-step_*) are removed, since no one else can be writing them.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

 private:
  int fd_ = -1;
};

struct LoadOptions {
  bool verify = true;       // check each file's size and sha256 before reading it
  bool restore_rng = true;  // the default generator's state: this rank's as saved (rank 0's at ranks
                            // the saving run did not have)
  // Frozen parameters the checkpoint does not hold keep their values (loaded before, from the
  // files they came from); any other missing tensor is still an error.
  bool frozen_elsewhere = false;
};

// Loads the checkpoint at `path` (or the latest under it) into the model and, unless null, the optimizer, whatever
// world size wrote it: each rank reads the pieces overlapping its shards. A collective call on every rank of root's
// mesh. All or nothing: every rank reads and checks everything before any tensor is written, and a failure on one rank
// fails all of them. Errors name the file and the key (a missing or truncated file, a hash mismatch, a tensor the model
// does not have or has in another shape, a tensor in a shard file that the index does not list, a NaN or infinity,
// optimizer state the optimizer refuses: nn::Optimizer::check_state).
CheckpointProgress load_checkpoint(const std::string& path, nn::Module& model, nn::Optimizer* opt, const FSDPModule* root,
                              const LoadOptions& options = {});

// ---- the index, for tools (one process, no model needed)

struct CheckpointIndex {
  struct File {
    std::string name;  // relative to the checkpoint directory
    int shard = 0;
    uint64_t bytes = 0;
    std::string sha256;
  };
  struct Shard {
    std::string file;
    int64_t offset = 0, length = 0;  // along the tensor's shard dim (of its part, when split)
    int64_t part = 0;                // the tensor-parallel part (Entry::split) it is of
  };
  struct Entry {
    std::string key;  // "model.<name>" or "optim.<key>"
    Shape shape;
    DType dtype = kFloat32;
    int64_t shard_dim = -1;  // -1: whole ("Replicate()"), one piece in the first file (of each part)
    tp::Split split;         // split in parts by tensor parallelism (index: 0), or not
    std::vector<Shard> shards;
    Placement placement(const Shard& s) const;  // where shard `s` sits
  };
  std::string dir;  // the checkpoint directory
  int format_version = 0;
  std::string weft_version;
  int world_size = 1, num_shards = 1;
  std::vector<int> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  std::vector<File> files;
  std::vector<Entry> tensors;  // model entries first, in state_dict order
  std::vector<Generator::State> rng;  // one per rank
  CheckpointProgress training;

  const Entry* find(const std::string& key) const;  // null if absent
  std::string file_path(const std::string& file) const;  // dir / file
};

// Reads and validates index.json of the checkpoint at `path` (or the latest under it).
CheckpointIndex read_checkpoint_index(const std::string& path);

struct VerifyReport {
  size_t files = 0, tensors = 0;
  uint64_t bytes = 0;
};
// Checks that every file exists with its recorded size and sha256, that each holds exactly the pieces the index names
// with their dtypes and shapes, that the pieces of every tensor cover it once, and that every floating value is finite.
// Throws a weft::Error naming the file and key of the first problem.
VerifyReport verify_checkpoint(const std::string& path);

// Writes the whole model (unsharded, names without the "model." prefix, plus the aliases) to
// one safetensors file, assembling one tensor at a time; with `with_optimizer` the optimizer's
// state too, under "optim.". The file's metadata is the app's description and the step. A NaN or
// infinity is an error naming the tensor (nothing is written) unless `allow_nonfinite`.
void consolidate_checkpoint(const std::string& path, const std::string& out, bool with_optimizer = false,
                            bool allow_nonfinite = false);

}  // namespace weft::fsdp
