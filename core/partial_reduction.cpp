#include "core/partial_reduction.h"

#include "core/autograd_meta.h"

namespace weft {

void set_partial_reduction(const Tensor& t, std::shared_ptr<const PartialReduction> reduction) {
  t.autograd_meta().partial_reduction = std::move(reduction);
}

std::shared_ptr<const PartialReduction> partial_reduction(const Tensor& t) {
  if (!t.defined() || !t.impl()->autograd) return nullptr;
  return t.impl()->autograd->partial_reduction;
}

}  // namespace weft
