#include "apps/common/ranks.h"

#include <fmt/format.h>

#include "core/tensor.h"

namespace weft::apps {

void agree_on_failure(const Ranks& ranks, const char* app, std::exception_ptr error) {
  if (ranks.fsdp) {
    Tensor failed = from_vector({error ? 1.0 : 0.0}, {1}, {.dtype = kFloat64});
    dist::world()->all_reduce(failed, dist::ReduceOp::max)->wait();
    if (!error && failed.item() > 0)
      throw AgreedError(fmt::format("{}: stopping because another rank failed (see its message)", app));
  }
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    throw AgreedError(e.what());
  }
}

double mean_over_ranks(double local, const Ranks& ranks) {
  if (!ranks.fsdp) return local;
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

}  // namespace weft::apps
