#include "nn/scheduler.h"

#include <algorithm>
#include <cmath>

namespace weft::nn {

LRScheduler::LRScheduler(Optimizer& opt) : opt_(opt) {
  WEFT_CHECK(opt.scheduled_by.expired(), "LRScheduler: the optimizer has a scheduler already, which sets its lr at "
             "each step from its own base: one would override the other (PyTorch chains them); give one schedule the "
             "whole shape (WarmupDecayLR: warmup, then decay)");
  opt.scheduled_by = owns_;
  for (size_t g = 0; g < opt_.num_groups(); ++g) base_lrs_.push_back(opt_.lr(g));
}

void LRScheduler::apply() {
  for (size_t g = 0; g < base_lrs_.size(); ++g) opt_.set_option(g, "lr", lr_at(step_, g));
}

void LRScheduler::step() { ++step_, apply(); }

void LRScheduler::set_last_step(int64_t step) {
  WEFT_CHECK(step >= 0, "LRScheduler: step must be >= 0, got {}", step);
  step_ = step;
  apply();
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(opt_.lr(g));
  return out;
}

LinearLR::LinearLR(Optimizer& opt, double s, double e, int64_t n)
    : LRScheduler(opt), start_factor(s), end_factor(e), total_iters(n) {
  // total_iters 0 ramps over no step: torch then keeps start_factor for ever, an end_factor never reached.
  WEFT_CHECK(s > 0 && s <= 1 && e >= 0 && e <= 1 && n >= 1,
             "LinearLR: need 0 < start_factor <= 1, 0 <= end_factor <= 1, total_iters >= 1; got {}, {}, {}", s, e, n);
  apply();
}
double LinearLR::factor(int64_t step) const {
  if (step >= total_iters) return end_factor;
  return start_factor + (end_factor - start_factor) * double(step) / double(total_iters);
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& opt, int64_t t, double eta)
    : LRScheduler(opt), t_max(t), eta_min(eta) {
  WEFT_CHECK(t > 0 && eta >= 0 && eta < HUGE_VAL, "CosineAnnealingLR: t_max must be > 0 and eta_min a finite number "
             ">= 0, got {} and {}", t, eta);
  apply();
}
double CosineAnnealingLR::lr_at(int64_t step, size_t group) const {  // on past t_max, as PyTorch's closed form
  return eta_min + (base_lrs_[group] - eta_min) * (1 + std::cos(M_PI * double(step) / double(t_max))) / 2;
}
double CosineAnnealingLR::factor(int64_t step) const { return base_lrs_[0] == 0 ? 0 : lr_at(step, 0) / base_lrs_[0]; }

StepLR::StepLR(Optimizer& opt, int64_t s, double g) : LRScheduler(opt), step_size(s), gamma(g) {
  WEFT_CHECK(s > 0 && g >= 0 && g < HUGE_VAL, "StepLR: step_size must be > 0 and gamma a finite number >= 0, got {} "
             "and {}", s, g);
  apply();
}
double StepLR::factor(int64_t step) const { return std::pow(gamma, double(step / step_size)); }

WarmupDecayLR::WarmupDecayLR(Optimizer& opt, int64_t w, int64_t t, double r, Decay d, int64_t ds)
    : LRScheduler(opt), warmup(w), total(t), decay_steps(d == Decay::wsd ? ds : 0), min_lr_ratio(r), decay(d) {
  WEFT_CHECK(w >= 0 && t > 0 && r >= 0 && r <= 1, "WarmupDecayLR: need 0 <= warmup, 0 < total and 0 <= min_lr_ratio "
             "<= 1; got {}, {}, {}", w, t, r);
  WEFT_CHECK(d != Decay::wsd || (ds >= 0 && ds <= std::max<int64_t>(0, t - w)), "WarmupDecayLR: wsd needs 0 <= "
             "decay_steps <= total - warmup ({} - {}); got {}", t, w, ds);
  apply();
}

double WarmupDecayLR::factor(int64_t step) const {
  if (step < warmup) return double(step + 1) / double(warmup);
  const int64_t start = decay == Decay::wsd ? total - decay_steps : warmup;  // where the decay begins
  const double progress = total > start ? std::clamp(double(step - start) / double(total - start), 0.0, 1.0) : 0.0;
  switch (decay) {
    case Decay::constant: return 1.0;
    case Decay::cosine: return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress));
    case Decay::linear:
    case Decay::wsd: return min_lr_ratio + (1 - min_lr_ratio) * (1 - progress);
  }
  return 1.0;
}

}  // namespace weft::nn
