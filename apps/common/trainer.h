// apps: the training loop that weft-mnist and weft-transformer share. An app validates its flags,
// builds (and shards) its model and its optimizer, and hands them to a Trainer with a
// TrainingTask: its batches, its evaluation and what its checkpoints record. The Trainer then
// restores (resume), runs the steps and writes the final checkpoint. One step, top to bottom (Trainer::train_step):
//   zero the gradients -> accumulate_gradients (forward and backward over the step's
//   micro-batches, or --deterministic's leaves) -> the NaN policy (NanPolicy) -> clip -> the
//   optimizer's step -> the schedule
// and around it (Trainer::run): log the step, stop on a signal (StopSignals), evaluate, save
// (CheckpointSaver). docs/ARCHITECTURE.md traces one weft-transformer step through it.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "apps/common/checkpoint_saver.h"
#include "apps/common/deterministic.h"
#include "apps/common/metrics.h"
#include "apps/common/nonfinite.h"
#include "apps/common/op_table.h"
#include "apps/common/progress.h"
#include "apps/common/ranks.h"
#include "apps/common/stop.h"
#include "autograd/ops.h"
#include "fsdp/fsdp.h"
#include "nn/module.h"
#include "nn/optimizer.h"
#include "nn/scheduler.h"
#include "nn/tree_sum.h"

namespace weft::apps {

// A micro-batch on the host: inputs, targets and, for packed rows, the inputs' positions
// (nn/documents.h; undefined otherwise).
struct Batch {
  Tensor x, y, positions;
};

// The loss of logits [rows, classes] against targets [rows]: weft::cross_entropy, or one over
// logits split by class among ranks (tp::vocab_parallel_cross_entropy).
using LossFn = std::function<Tensor(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& opts)>;
inline Tensor loss_of(const LossFn& fn, const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& opts = {}) {
  return fn ? fn(logits, targets, opts) : cross_entropy(logits, targets, opts);
}

// One forward and backward of (x, y): the cross-entropy (`loss`, when given) of the logits (flattened to [rows,
// classes]) against y; the gradient of loss / `parts` is added to the gradients already there. With `positions` defined
// the model is called with (x, positions). Under `autocast` the forward and the loss run in bf16 autocast. With
// `target_scale` > 0 the loss is instead the sum of the cross-entropies of the targets that are not -100, times
// target_scale (a share of a mean over a larger batch). Returns the loss.
Tensor forward_backward(nn::Module& model, const Tensor& x, const Tensor& y, bool autocast, int64_t parts,
                        double target_scale = 0, const Tensor& positions = {}, const LossFn& loss = {});

// The number of parameter elements (this rank's shards, once sharded).
int64_t count_parameters(const nn::Module& model);

// What an app gives the loop.
class TrainingTask {
 public:
  virtual ~TrainingTask() = default;
  // Inputs and targets, on the host: rows [lo, hi) of accumulated batch `micro` of step `step`
  // (0-based: the step about to run). Every rank walks the same global batches.
  virtual Batch batch(int64_t step, int64_t micro, int64_t lo, int64_t hi) = 0;
  // The targets that carry loss (not -100) in step `step`'s global batch, all micro-batches and ranks: the loss is then
  // their mean, whichever rows hold them. 0 (the default): the mean of each micro-batch's mean, all weighing the same.
  virtual int64_t step_targets(int64_t /*step*/) { return 0; }
  // Evaluates after `at.step` steps: prints, writes its metrics line and checks the result with
  // `at.nan` (which throws on every rank when it is not finite).
  struct Evaluation {
    int64_t step;
    double train_loss;  // the last step's
    MetricsWriter& metrics;
    const NanPolicy& nan;
    const CheckpointWatch& watch;  // names the checkpoint to go back to
  };
  virtual void evaluate(const Evaluation& at) = 0;
  // A checkpoint's data position and description after `step` steps.
  virtual fsdp::CheckpointProgress checkpoint(int64_t step) = 0;
};

// How the loop runs; the apps fill it from their flags.
struct LoopOptions {
  std::string program;          // "weft-mnist": names the process in messages
  Device device = kCPU;         // where the batches go
  int64_t batch_size = 1;       // the global batch of one micro-step, in rows
  int64_t accumulation = 1;     // micro-steps per optimizer step
  int64_t items_per_step = 1;   // what the progress bar and the rate count per step...
  std::string unit = "samples";  // ...and its name ("tokens": the metric is tokens_per_s)
  int64_t epoch_steps = 0;      // > 0: steps per epoch (progress, rates and evaluation per epoch;
                                // metrics lines name the epoch); 0: the run is one stretch
  int64_t eval_every = 0;       // also evaluate every N steps (0: at the end of each stretch only)
  int64_t log_every = 1;        // steps between metrics lines (and the last of each stretch)
  bool log_first = false;       // also the run's first step
  bool log_grad_norm = false, log_peak_bytes = false;
  double clip = 0;              // gradient norm clip (0: none)
  bool autocast = false;        // bf16 autocast (unsharded --mixed-precision bf16)
  LossFn loss;                  // null: weft::cross_entropy
  OnNan on_nan = OnNan::error;
  int64_t max_skipped = 5;
  CheckpointFlags checkpoints;
  int64_t profile_from = 0;     // > 0: time every op of the steps from this one (1-based) to the end and
                                // print their table after the run (the lead rank's; apps/common/op_table.h)
};

// The model and what steps it. `root` is the FSDP root under --fsdp (else null); `sched` may be null.
struct TrainingParts {
  nn::Module* model;
  nn::Optimizer* opt;
  nn::LRScheduler* sched;
  fsdp::FSDPModule* root;
};

class Trainer {
 public:
  Trainer(LoopOptions o, TrainingParts parts, const Ranks& ranks, std::optional<LeafPlan> leaves, TrainingTask& task,
          MetricsWriter& metrics);
  // Loads model, optimizer and RNG from `checkpoint` (written at any world size); the schedule
  // goes on from its step. Returns the step.
  int64_t resume(const std::string& checkpoint);
  int64_t step() const { return step_; }
  // Trains until `end` steps are done (the final checkpoint included). The exit status: 0, or
  // 128 + the signal when SIGTERM or SIGINT stopped the run after a step (and its checkpoint).
  int run(int64_t end);

 private:
  int train_step();
  StepEnd accumulate_gradients();
  double backward_on(int64_t micro, int64_t lo, int64_t hi, int64_t parts, int64_t targets);
  int64_t open_stretch(int64_t first, int64_t end);
  void close_stretch();
  void log_step(int64_t first, int64_t stretch_end, bool stopping);
  void save();
  int stop(int sig);

  LoopOptions o_;
  TrainingParts p_;
  const Ranks& ranks_;
  std::optional<LeafPlan> leaves_;  // --deterministic
  TrainingTask& task_;
  MetricsWriter& metrics_;
  NanPolicy nan_;
  CheckpointSaver saver_;
  const std::vector<Tensor> params_;  // the model's (this rank's shards once sharded): clipping, --deterministic
  nn::TreeSum grad_tree_;  // --deterministic without --fsdp: the leaves' gradients
  int64_t step_ = 0;       // steps done
  double loss_ = 0, lr_ = 0, grad_norm_ = -1;  // of the last step (grad_norm_ before clipping; -1: not measured)
  std::optional<Progress> progress_;
  StepProfile profile_;
  int64_t stretch_start_ = 0, window_items_ = 0;
  std::chrono::steady_clock::time_point window_start_;
};

}  // namespace weft::apps
