// apps: NaN and infinity are bad input. A non-finite loss stops training (or skips the step,
// or is ignored: --on-nan); a checkpoint is never written from, or loaded into, parameters that
// hold a NaN or an infinity.
#pragma once
#include <string>

#include "apps/common/checkpoint_watch.h"
#include "apps/common/ranks.h"
#include "nn/module.h"

namespace weft::apps {

// "nan", "inf" or "-inf" (or the number, when finite).
std::string describe_value(double v);

// The first parameter holding a NaN or an infinity, as "NAME (nan at element I)"; empty when
// all are finite. One pass over each tensor (copied to the host as f64 when needed).
std::string first_nonfinite(const nn::NamedTensorList& params);

// Throws weft::Error "<context>: parameter NAME holds nan at element I<advice>" when a parameter
// is not finite. Run it inside dist::agree so every rank learns of a failure on any rank.
void check_finite_parameters(const nn::Module& model, const std::string& context, const std::string& advice = "");

// What to do when the (rank-averaged) loss is not finite: --on-nan.
enum class OnNan { error, skip, ignore };
OnNan parse_on_nan(const std::string& s);

// For --on-nan error: throws dist::AgreedError on every rank with the same message (the loss is
// already averaged over ranks, so every rank decides the same and none is left waiting).
// `checkpoint_advice` names the checkpoint to resume from (CheckpointWatch::advice).
[[noreturn]] void stop_on_nonfinite_loss(const std::string& program, double loss, int64_t step, const Ranks& ranks,
                                         const std::string& checkpoint_advice);

// For --on-nan skip: counts the steps skipped in a row and, after `max_in_a_row` of them, gives
// up as stop_on_nonfinite_loss does (a diverged model does not recover by skipping updates).
class SkipLimit {
 public:
  SkipLimit(const std::string& program, int64_t max_in_a_row) : program_(program), max_(max_in_a_row) {}
  // After each step: whether its update was skipped. Throws dist::AgreedError at the limit,
  // naming the checkpoint `watch` advises.
  void step_done(int64_t step, bool skipped, const CheckpointWatch& watch);
  int64_t total() const { return total_; }

 private:
  std::string program_;
  int64_t max_, in_a_row_ = 0, total_ = 0;
};

}  // namespace weft::apps
