// dist: a PartialReduction (core/partial_reduction.h) that combines over a ProcessGroup. fsdp
// attaches one to every shard it registers, naming the group whose ranks hold the other parts,
// so that code below dist (nn::clip_grad_norm_) can complete a reduction over sharded tensors.
#pragma once
#include <memory>

#include "../core/partial_reduction.h"
#include "process_group.h"

namespace weft::dist {

// Sums or maxes a partial value over `group` (one f64 all-reduce on the group's device), then
// over `then`'s processes when given: a part of a part, e.g. fsdp's shard of a parameter that
// tensor parallelism split first (then: the tensor-parallel group's reduction).
std::shared_ptr<const PartialReduction> reduction_over(ProcessGroupPtr group,
                                                       std::shared_ptr<const PartialReduction> then = nullptr);

}  // namespace weft::dist
