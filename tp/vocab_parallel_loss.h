// tp: cross-entropy over logits split by vocabulary (Megatron's vocab-parallel cross-entropy, PyTorch's loss_parallel):
// each rank holds logits [N, V/P], the columns rank * V/P ... of the whole [N, V], which never exist on one rank. Per
// row, the maximum, the sum of exponentials and the target's logit are each one all-reduce over `group`; every rank
// gets the same loss, and the gradient of its own columns (softmax - one-hot, restricted to them).
#pragma once
#include "../autograd/ops.h"
#include "../dist/process_group.h"

namespace weft::tp {

// Of vocabulary ids (any integer dtype), those in the rows [first, first + n): `hit` 1 where
// they are (f32, 0 elsewhere), `local` the row within them (i64; 0 where not hit).
struct VocabRows {
  Tensor hit, local;
};
VocabRows vocab_rows_of(const Tensor& ids, int64_t first, int64_t n);
// The flat index of the first of `ids` outside [0, total) where `counted` (f32 of ids' shape,
// 1 where an id counts; undefined: all count) is 1, or -1 if none (meta ids: -1, no values).
int64_t first_id_outside(const Tensor& ids, int64_t total, const Tensor& counted = {});

// As weft::cross_entropy over the whole logits: targets [N] (i64, in [0, V) or ignore_index), reduction "mean" (over
// the targets not ignored), "sum" or "none"; label smoothing is refused. Logits of a 16-bit dtype are taken in f32.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, const dist::ProcessGroupPtr& group,
                                    const CrossEntropyOptions& opts = {});

}  // namespace weft::tp
