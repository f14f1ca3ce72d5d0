// tp: the collectives of tensor parallelism as differentiable ops (Megatron's f and g and their
// sequence-parallel forms), each backward the transpose of its forward:
//   copy_to_parallel          identity                 | all-reduce (sum) of the gradient
//   reduce_from_parallel      all-reduce (sum)         | identity
//   gather_from_parallel      all-gather along dim     | this rank's block of the gradient
//   scatter_to_parallel       this rank's block        | all-gather of the gradient
//   gather_sequence_parallel  all-gather along dim     | reduce-scatter of the gradient
//   reduce_scatter_parallel   reduce-scatter along dim | all-gather of the gradient
// A column-parallel layer's input passes copy_to_parallel (each rank's part of the output contributes a part of the
// input's gradient); a row-parallel layer's output passes reduce_from_parallel (each rank holds a partial sum). With
// the sequence split between them (sequence parallel) the pair becomes gather_sequence_parallel and
// reduce_scatter_parallel on the sequence dim. Blocks are rank order along `dim`, whose size must divide by the ranks
// (scattered, reduce-scattered). Issued from the calling thread and waited for before they return; every rank of
// `group` calls them in the same order.
#pragma once
#include "../core/tensor.h"
#include "../dist/process_group.h"

namespace weft::tp {

Tensor copy_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group);
Tensor reduce_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group);
// Ranks' tensors, equal in shape, joined along `dim` in rank order.
Tensor gather_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim);
Tensor scatter_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim);
Tensor gather_sequence_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim);
Tensor reduce_scatter_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim);

}  // namespace weft::tp
