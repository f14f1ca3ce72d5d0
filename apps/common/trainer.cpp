#include "apps/common/trainer.h"

#include <cstdio>
#include <fmt/format.h>

#include "autograd/autocast.h"
#include "core/allocator.h"
#include "nn/clip_grad.h"
#include "nn/loss.h"

namespace weft::apps {

Tensor forward_backward(nn::Module& model, const Tensor& x, const Tensor& y, bool autocast, int64_t parts,
                        double target_scale, const Tensor& positions, const LossFn& loss_fn) {
  Tensor loss;
  {
    AutocastGuard bf16(DType::bf16, autocast);
    Tensor logits = positions.defined() ? model({x, positions})[0] : model(x);
    const CrossEntropyOptions opts{.reduction = target_scale > 0 ? "sum" : "mean"};
    Tensor flat = logits.view({-1, logits.size(-1)}), targets = y.view({-1});
    loss = loss_of(loss_fn, flat, targets, opts);
    if (target_scale > 0) loss = loss * target_scale;
  }
  (parts > 1 ? loss * (1.0 / double(parts)) : loss).backward();
  return loss;
}

int64_t count_parameters(const nn::Module& model) {
  int64_t n = 0;
  for (auto& p : model.parameters()) n += p.numel();
  return n;
}

Trainer::Trainer(LoopOptions o, TrainingParts parts, const Ranks& ranks, std::optional<LeafPlan> leaves,
                 TrainingTask& task, MetricsWriter& metrics)
    : o_(std::move(o)),
      p_(parts),
      ranks_(ranks),
      leaves_(std::move(leaves)),
      task_(task),
      metrics_(metrics),
      nan_(o_.program, o_.on_nan, o_.max_skipped),
      saver_(o_.program, o_.checkpoints, *p_.model, *p_.opt, p_.root, ranks),
      params_(p_.model->parameters()),
      profile_(o_.profile_from) {}

int64_t Trainer::resume(const std::string& checkpoint) {
  const std::string name = error_prefix(o_.program);
  dist::agree(ranks_.groups(), name, [&] {
    step_ = fsdp::load_checkpoint(checkpoint, *p_.model, p_.opt, p_.root,
                                  {.frozen_elsewhere = o_.checkpoints.frozen_elsewhere}).step;
    check_finite_parameters(*p_.model, fmt::format("{}: refusing to resume from {}", name, checkpoint));
  });
  const double restored_lr = p_.opt->lr();  // the checkpoint's, with its optimizer state
  if (p_.sched) p_.sched->set_last_step(step_);
  if (p_.sched && std::abs(p_.opt->lr() - restored_lr) > 1e-12 * restored_lr && ranks_.lead())
    std::fprintf(stderr, "%s: this run's schedule sets the learning rate of step %lld, the next, to %g; the "
                 "checkpoint's was %g (--lr and the schedule's flags decide it on resume)\n", o_.program.c_str(),
                 (long long)(step_ + 1), p_.opt->lr(), restored_lr);
  saver_.resumed(checkpoint, step_);
  if (ranks_.lead()) std::fprintf(stderr, "resumed from %s at step %lld\n", checkpoint.c_str(), (long long)step_);
  return step_;
}

int Trainer::run(int64_t end) {
  const int64_t first = step_;
  // From here a signal stops the run after its step (stop.h); before, the default action ends
  // it at once (a process blocked while starting up could not reach a step's end).
  StopSignals stop_signals(o_.program);
  saver_.check_schedule(step_, end);
  WEFT_CHECK(o_.profile_from <= end, "{}: --profile {} is past this run's last step, {}: nothing would be profiled",
             error_prefix(o_.program), o_.profile_from, end);
  if (saver_.enabled())  // what a save would record, before any step rather than after the first of them
    dist::agree(ranks_.groups(), error_prefix(o_.program), [&] { fsdp::check_recordable(task_.checkpoint(step_)); });
  if (step_ >= end && ranks_.lead())  // resumed at its last step
    std::fprintf(stderr, "%s: nothing to train: step %lld is the run's last\n", o_.program.c_str(), (long long)step_);
  while (step_ < end) {
    const int64_t stretch_end = open_stretch(first, end);  // an epoch, or the whole run
    while (step_ < stretch_end) {
      profile_.start_step(step_ + 1);
      const int sig = train_step();
      profile_.end_step();
      // A signal during the last step stops nothing: the run ends as it would have.
      log_step(first, stretch_end, sig != 0 && step_ < end);
      if (sig != 0 && step_ < end) return stop(sig);
      const auto paused = std::chrono::steady_clock::now();  // evaluation and saving: outside the rate's window
      if (step_ == stretch_end) close_stretch();
      if (step_ == stretch_end || (o_.eval_every > 0 && step_ % o_.eval_every == 0))
        task_.evaluate({step_, loss_, metrics_, nan_, saver_.watch()});
      if (saver_.due(step_, end)) save();
      window_start_ += std::chrono::steady_clock::now() - paused;
    }
  }
  if (ranks_.lead()) profile_.print();
  if (nan_.skipped() > 0 && ranks_.lead())
    std::fprintf(stderr, "%s: skipped %lld of %lld steps: their loss was not finite (--on-nan skip)\n",
                 o_.program.c_str(), (long long)nan_.skipped(), (long long)(end - first));
  return 0;
}

// One optimizer step; returns the stop signal the ranks agreed on with its loss (0: none).
int Trainer::train_step() {
  p_.opt->zero_grad();
  const StepEnd end = accumulate_gradients();  // the loss: the global batch's mean, on every rank
  loss_ = end.loss;
  saver_.watch().loss(step_ + 1, loss_);
  lr_ = p_.opt->lr();
  grad_norm_ = -1;  // not measured: no clipping, or a skipped update
  if (nan_.skip(loss_, step_ + 1, ranks_, saver_.watch())) {
    p_.opt->zero_grad();  // drop this step's update; the schedule and the data still move on
  } else {
    // Clipped as clip_grad_norm_ clips (sharded or not), its factor applied as the update reads the gradients.
    const nn::GradClip clip = o_.clip > 0 ? nn::clip_grad_coefficient(params_, o_.clip) : nn::GradClip{0, 1};
    grad_norm_ = o_.clip > 0 ? clip.norm : -1;
    p_.opt->step_scaled(clip.coef);
  }
  if (p_.sched) p_.sched->step();
  ++step_;
  return end.stop_signal;
}

// The step's gradients, and its loss and stop signal agreed over the ranks. Plain: the rank's
// rows of each accumulated batch, their backwards adding into .grad (FSDP reduces each).
// --deterministic: the rank's leaves in order, each with its own dropout stream, gradients
// reduced (or summed) along the fixed tree after the last; the loss their mean in one order.
StepEnd Trainer::accumulate_gradients() {
  const int64_t targets = task_.step_targets(step_);
  if (!leaves_) {
    const int64_t lo = o_.batch_size * ranks_.data_rank() / ranks_.data_world(),
                  hi = o_.batch_size * (ranks_.data_rank() + 1) / ranks_.data_world();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < o_.accumulation; ++micro)
      loss_sum += backward_on(micro, lo, hi, o_.accumulation, targets);
    return end_step(loss_sum / double(o_.accumulation), ranks_);
  }
  const int64_t n = leaves_->leaves();
  std::vector<double> losses;
  run_leaves(*leaves_, o_.batch_size, p_.root, grad_tree_, params_, [&](int64_t j, int64_t lo, int64_t hi) {
    LeafRandom dropout(step_, leaves_->tree_index(j), n * ranks_.world);
    losses.push_back(backward_on(leaves_->accumulated(j), lo, hi, n, targets));
  });
  return end_step(ordered_mean(losses, 1, ranks_), ranks_, true);
}

// One part's forward and backward. With the step's `targets` counted, the part's loss is its share
// of their mean, scaled by the `parts` x world parts the loop averages (so the average is the mean).
double Trainer::backward_on(int64_t micro, int64_t lo, int64_t hi, int64_t parts, int64_t targets) {
  const Batch b = task_.batch(step_, micro, lo, hi);
  const double scale = targets > 0 ? double(parts) * double(ranks_.data_world()) / double(targets) : 0;
  const Tensor positions = b.positions.defined() ? b.positions.to(o_.device) : Tensor();
  return forward_backward(*p_.model, b.x.to(o_.device), b.y.to(o_.device), o_.autocast, parts, scale, positions,
                          o_.loss).item();
}

// A stretch of steps with one progress bar and its own rate window: an epoch (ending at the
// epoch's end or at `end`), or the rest of the run. Returns its end.
int64_t Trainer::open_stretch(int64_t first, int64_t end) {
  int64_t stretch_end = end;
  stretch_start_ = first;
  std::string label = "train";
  if (o_.epoch_steps > 0) {
    const int64_t epoch = step_ / o_.epoch_steps;
    stretch_start_ = epoch * o_.epoch_steps;
    stretch_end = std::min(stretch_start_ + o_.epoch_steps, end);
    label = fmt::format("epoch {}", epoch + 1);
  }
  if (ranks_.lead()) progress_.emplace(label, stretch_end - stretch_start_, o_.unit);
  window_start_ = std::chrono::steady_clock::now();
  window_items_ = 0;
  return stretch_end;
}

void Trainer::close_stretch() {
  if (progress_) progress_->finish(fmt::format("loss {:.4f}", unsigned_nan(loss_)));
  progress_.reset();
}

void Trainer::log_step(int64_t first, int64_t stretch_end, bool stopping) {
  window_items_ += o_.items_per_step;
  if (progress_) progress_->update(step_ - stretch_start_, o_.items_per_step, fmt::format("loss {:.4f}", unsigned_nan(loss_)));
  if (step_ % o_.log_every != 0 && step_ != stretch_end && !stopping && !(o_.log_first && step_ == first + 1)) return;
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - window_start_).count();
  std::map<std::string, MetricValue> line = {{"step", step_}, {"loss", loss_}, {"lr", lr_}, {"skipped", nan_.skipped()},
                                             {o_.unit + "_per_s", dt > 0 ? double(window_items_) / dt : 0.0}};
  if (o_.epoch_steps > 0) line["epoch"] = (step_ - 1) / o_.epoch_steps + 1;
  if (o_.log_grad_norm && grad_norm_ >= 0) line["grad_norm"] = grad_norm_;
  if (o_.log_peak_bytes) line["peak_bytes"] = memory_stats().peak_bytes;
  metrics_.write(line);
  window_start_ = now;
  window_items_ = 0;
}

void Trainer::save() {
  fsdp::CheckpointProgress progress = task_.checkpoint(step_);
  progress.step = step_;
  progress.loss = loss_;
  saver_.save(progress);
}

// SIGTERM or SIGINT: the step is done; save it (no evaluation) and stop.
int Trainer::stop(int sig) {
  close_stretch();
  if (saver_.enabled() && !saver_.saved(step_)) save();
  return report_stop(o_.program, sig, step_, saver_.enabled() ? saver_.last() : "", ranks_,
                     fmt::format("no checkpoint written (no {})", saver_.flags().flag));
}

}  // namespace weft::apps
