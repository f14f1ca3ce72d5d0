#include "fsdp/clip_grad.h"

#include "fsdp/state.h"

namespace weft::fsdp {

double clip_grad_norm_(const FSDPModule& module, double max_norm, double norm_type) {
  std::vector<Tensor> shards;
  for (FSDPState* s : module.subtree())
    if (s->group)
      for (auto& p : s->group->params()) shards.push_back(p->sharded());
  return nn::clip_grad_norm_(shards, max_norm, norm_type);
}

}  // namespace weft::fsdp
