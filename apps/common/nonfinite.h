// apps: NaN and infinity are bad input. A non-finite loss stops training (or skips the step,
// or is ignored: --on-nan); a checkpoint is never written from, or loaded into, parameters that
// hold a NaN or an infinity.
#pragma once
#include <string>

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
[[noreturn]] void stop_on_nonfinite_loss(const std::string& program, double loss, int64_t step, const Ranks& ranks,
                                         const std::string& last_checkpoint);

}  // namespace weft::apps
