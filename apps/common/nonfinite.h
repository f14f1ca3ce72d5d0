// apps: NaN and infinity are bad input. A non-finite loss stops training (or skips the step, or is ignored: --on-nan);
// a checkpoint is never written from, or loaded into, parameters that hold a NaN or an infinity.
#pragma once
#include <string>

#include "apps/common/checkpoint_watch.h"
#include "apps/common/ranks.h"
#include "nn/module.h"

namespace weft::apps {

// "nan", "inf" or "-inf" (or the number, when finite); unsigned_nan(v) prints a NaN as "nan" (x86's is "-nan").
std::string describe_value(double v);
inline double unsigned_nan(double v) { return v != v ? __builtin_nan("") : v; }

// The first parameter holding a NaN or an infinity, as "NAME (nan at element I)"; empty when
// all are finite. One pass over each tensor (copied to the host as f64 when needed).
std::string first_nonfinite(const nn::NamedTensorList& params);

// Throws weft::Error "<context>: parameter NAME holds nan at element I<advice>" when a parameter
// is not finite. Run it inside dist::agree so every rank learns of a failure on any rank.
void check_finite_parameters(const nn::Module& model, const std::string& context, const std::string& advice = "");

// What to do when the (rank-averaged) loss is not finite: --on-nan.
enum class OnNan { error, skip, ignore };
OnNan parse_on_nan(const std::string& s);

// The --on-nan policy of a run, asked once per step with the step's loss (the mean over the
// global batch, the same on every rank, so every rank decides alike).
class NanPolicy {
 public:
  // `program` names the process in messages ("weft-mnist"); `max_in_a_row`: --max-skipped-steps.
  NanPolicy(std::string program, OnNan mode, int64_t max_in_a_row);
  // Whether the update of the step that logged `loss` at `step` is to be dropped. A finite loss, or --on-nan ignore:
  // false. --on-nan error: throws dist::AgreedError on every rank, naming the checkpoint `watch` advises. --on-nan
  // skip: says so and returns true, until the --max-skipped-steps'th skip in a row, which gives up as error does (a
  // diverged model does not recover by skipping updates).
  bool skip(double loss, int64_t step, const Ranks& ranks, const CheckpointWatch& watch);
  // An evaluation's loss: throws dist::AgreedError naming `what` ("the validation loss is nan at
  // step 7") when it is not finite, unless --on-nan ignore.
  void check_evaluation(double loss, const std::string& what, const CheckpointWatch& watch) const;
  int64_t skipped() const { return total_; }

 private:
  std::string program_;
  OnNan mode_;
  int64_t max_, in_a_row_ = 0, total_ = 0;
};

}  // namespace weft::apps
