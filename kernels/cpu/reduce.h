// kernels/cpu: reduction loops. The public layer (kernels/reduce.cpp) lays the input out so that its memory is
// contiguous and reads as [outer, reduced, inner, inner_reduced] from x.data_ptr(), reducing dims 1 and 3; the output
// is contiguous [outer, inner]. inner == 1 reduces contiguous rows; inner > 1 with inner_reduced == 1 accumulates whole
// rows (e.g. a bias gradient, the sum over dim 0 of [N, D]); inner_reduced > 1 is e.g. the sum over dims (0, 2, 3) of
// [N, C, H, W].
#pragma once
#include "core/tensor.h"
#include "kernels/reduce.h"

namespace weft::kernels::cpu {

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
            int64_t inner_reduced = 1);
// Values (x's dtype) and i64 indices of the max (or min) over the reduced range; reduced > 0.
void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x, int64_t outer,
                int64_t reduced, int64_t inner);

}  // namespace weft::kernels::cpu
