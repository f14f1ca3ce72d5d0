// nn: learning-rate schedules. A scheduler owns the optimizer's "lr" option: construction
// records each group's base lr and applies the schedule's value for step 0; step() advances
// one step and sets lr = base_lr * factor(step), with closed forms as torch.optim.lr_scheduler.
#pragma once
#include <memory>
#include <vector>

#include "optimizer.h"

namespace weft::nn {

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt);
  virtual ~LRScheduler() = default;
  void step();
  int64_t last_step() const { return step_; }
  std::vector<double> get_last_lr() const;
  // Multiplier of the base lr at `step` (0 = before the first optimizer step).
  virtual double factor(int64_t step) const = 0;
  // The lr of `group` at `step`: its base lr times factor(step), unless a schedule says otherwise.
  virtual double lr_at(int64_t step, size_t group) const { return base_lrs_[group] * factor(step); }
  // For checkpoints: restores the position (and re-applies the lr).
  void set_last_step(int64_t step);

 protected:
  void apply();
  Optimizer& opt_;
  std::shared_ptr<const char> owns_ = std::make_shared<const char>();  // opt_.scheduled_by while alive
  std::vector<double> base_lrs_;
  int64_t step_ = 0;
};

// Linear ramp from start_factor to end_factor over total_iters steps, then constant (LinearLR).
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double factor(int64_t step) const override;
  double start_factor, end_factor;
  int64_t total_iters;
};

// eta_min + (base - eta_min) * (1 + cos(pi * step / t_max)) / 2, as torch's: past t_max it rises again (back to
// base at 2 t_max).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0.0);
  double factor(int64_t step) const override;  // group 0's lr over its base
  double lr_at(int64_t step, size_t group) const override;  // eta_min + (base - eta_min)(1 + cos(pi step / t_max)) / 2
  int64_t t_max;
  double eta_min;
};

// lr * gamma^(step / step_size) (integer division), as StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double factor(int64_t step) const override;
  int64_t step_size;
  double gamma;
};

// Linear warmup to the base lr over `warmup` steps ((step + 1) / warmup), then a decay to
// min_lr_ratio * base at `total` steps, flat after it: cosine, linear, constant (no decay), or
// wsd (warmup-stable-decay: the base lr until the last `decay_steps`, then linear to the minimum).
// A warmup as long as the run or longer ramps at its own rate to the end (as Hugging Face's).
class WarmupDecayLR : public LRScheduler {
 public:
  enum class Decay { constant, linear, cosine, wsd };
  WarmupDecayLR(Optimizer& opt, int64_t warmup, int64_t total, double min_lr_ratio, Decay decay,
                int64_t decay_steps = 0);
  double factor(int64_t step) const override;
  int64_t warmup, total, decay_steps;
  double min_lr_ratio;
  Decay decay;
};

// The usual GPT schedule: warmup, then cosine to min_lr_ratio * base.
class WarmupCosineLR : public WarmupDecayLR {
 public:
  WarmupCosineLR(Optimizer& opt, int64_t warmup, int64_t total, double min_lr_ratio = 0.1)
      : WarmupDecayLR(opt, warmup, total, min_lr_ratio, Decay::cosine) {}
};

}  // namespace weft::nn
