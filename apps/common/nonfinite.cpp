#include "apps/common/nonfinite.h"

#include <cmath>
#include <cstdio>
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

NanPolicy::NanPolicy(std::string program, OnNan mode, int64_t max_in_a_row)
    : program_(std::move(program)), mode_(mode), max_(max_in_a_row) {}

bool NanPolicy::skip(double loss, int64_t step, const Ranks& ranks, const CheckpointWatch& watch) {
  const std::string name = error_prefix(program_);
  const bool skipped = !std::isfinite(loss) && mode_ != OnNan::ignore;
  if (skipped && mode_ == OnNan::error)
    throw dist::AgreedError(fmt::format("{}: the loss is {} at step {}{}; training stopped; {} — lower --lr or use "
                                        "--on-nan skip", name, describe_value(loss), step,
                                        ranks.fsdp ? fmt::format(" (the mean over {} ranks)", ranks.world) : "",
                                        watch.advice()), 0);
  in_a_row_ = skipped ? in_a_row_ + 1 : 0;
  total_ += skipped ? 1 : 0;
  if (!skipped) return false;
  if (ranks.lead())
    std::fprintf(stderr, "%s: the loss is %s at step %lld; skipped its update (%lld skipped)\n", program_.c_str(),
                 describe_value(loss).c_str(), (long long)step, (long long)total_);
  if (in_a_row_ < max_) return true;
  throw dist::AgreedError(fmt::format("{}: the loss was not finite for {} steps in a row (steps {} to {}; "
                                      "--max-skipped-steps {}): skipping updates does not bring a diverged model "
                                      "back; training stopped; {} — lower --lr", name, in_a_row_,
                                      step - in_a_row_ + 1, step, max_, watch.advice()), 0);
}

void NanPolicy::check_evaluation(double loss, const std::string& what, const CheckpointWatch& watch) const {
  if (std::isfinite(loss) || mode_ == OnNan::ignore) return;
  throw dist::AgreedError(fmt::format("{}: {}: the model has diverged; training stopped; {}", error_prefix(program_),
                                      what, watch.advice()), 0);
}

}  // namespace weft::apps
