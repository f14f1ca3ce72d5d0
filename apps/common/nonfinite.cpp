#include "apps/common/nonfinite.h"

#include <cmath>
#include <fmt/format.h>

#include "core/element_search.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/agree.h"

namespace weft::apps {

std::string describe_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

std::string first_nonfinite(const nn::NamedTensorList& params) {
  for (auto& [name, p] : params)
    if (auto bad = find_nonfinite(p)) return fmt::format("{} ({})", name, bad->str());
  return {};
}

void check_finite_parameters(const nn::Module& model, const std::string& context, const std::string& advice) {
  std::string bad = first_nonfinite(model.named_parameters());
  WEFT_CHECK(bad.empty(), "{}: parameter {} is not finite{}", context, bad, advice);
}

OnNan parse_on_nan(const std::string& s) {
  if (s == "error") return OnNan::error;
  if (s == "skip") return OnNan::skip;
  if (s == "ignore") return OnNan::ignore;
  throw Error(fmt::format("--on-nan must be error, skip or ignore, not \"{}\"", s));
}

void stop_on_nonfinite_loss(const std::string& program, double loss, int64_t step, const Ranks& ranks,
                            const std::string& checkpoint_advice) {
  std::string msg = fmt::format(
      "{}: the loss is {} at step {}{}; training stopped; {} — lower --lr or use --on-nan skip", program,
      describe_value(loss), step,
      ranks.fsdp ? fmt::format(" (the mean over {} ranks)", ranks.world) : std::string(), checkpoint_advice);
  throw dist::AgreedError(msg, 0);
}

void SkipLimit::step_done(int64_t step, bool skipped, const CheckpointWatch& watch) {
  in_a_row_ = skipped ? in_a_row_ + 1 : 0;
  total_ += skipped ? 1 : 0;
  if (in_a_row_ < max_) return;
  throw dist::AgreedError(fmt::format("{}: the loss was not finite for {} steps in a row (steps {} to {}; "
                                      "--max-skipped-steps {}): skipping updates does not bring a diverged model "
                                      "back; training stopped; {} — lower --lr", program_, in_a_row_,
                                      step - in_a_row_ + 1, step, max_, watch.advice()), 0);
}

}  // namespace weft::apps
