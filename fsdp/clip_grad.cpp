#include "fsdp/clip_grad.h"

#include "fsdp/state.h"

namespace weft::fsdp {

double clip_grad_norm_(const FSDPModule& module, double max_norm, double norm_type) {
  std::vector<Tensor> shards;
  for (auto& [name, m] : module.module().named_modules())
    if (auto s = state_of(*m); s && s->group)
      for (auto& p : s->group->params()) shards.push_back(p->sharded());
  return nn::clip_grad_norm_(shards, max_norm, norm_type);
}

}  // namespace weft::fsdp
