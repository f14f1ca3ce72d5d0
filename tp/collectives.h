// tp: the collectives of tensor parallelism as differentiable ops (Megatron's f and g), each
// the other's transpose in backward:
//   copy_to_parallel      forward: identity           backward: all-reduce (sum) of the gradient
//   reduce_from_parallel  forward: all-reduce (sum)   backward: identity
//   gather_from_parallel  forward: all-gather on dim  backward: this rank's slice of the gradient
// A column-parallel layer's input passes copy_to_parallel (each rank's part of the output
// contributes a part of the input's gradient); a row-parallel layer's output passes
// reduce_from_parallel (each rank holds a partial sum). Issued from the calling thread and
// waited for before they return; every rank of `group` calls them in the same order.
#pragma once
#include "core/tensor.h"
#include "dist/process_group.h"

namespace weft::tp {

Tensor copy_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group);
Tensor reduce_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group);
// Ranks' tensors, equal in shape, joined along `dim` in rank order.
Tensor gather_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim);

}  // namespace weft::tp
