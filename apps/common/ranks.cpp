#include "apps/common/ranks.h"

#include "core/tensor.h"

namespace weft::apps {

std::vector<dist::ProcessGroupPtr> Ranks::groups() const {
  if (!fsdp) return {};
  return {dist::world()};
}

double mean_over_ranks(double local, const Ranks& ranks) {
  if (!ranks.fsdp) return local;
  Tensor t = from_vector({local}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::avg)->wait();
  return t.item();
}

}  // namespace weft::apps
