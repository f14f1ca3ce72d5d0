#include "nn/loss.h"

namespace weft::nn {

Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  WEFT_CHECK(input.shape() == target.shape() && is_floating(input.dtype()) && is_floating(target.dtype()), "mse_loss: "
             "input {} and target {} must be floating tensors of one shape", tensor_desc(input), tensor_desc(target));
  Tensor sq = square(input - target);
  if (reduction == "mean") return mean(sq);
  if (reduction == "sum") return sum(sq);
  WEFT_CHECK(reduction == "none", "mse_loss: reduction must be \"mean\", \"sum\" or \"none\", got \"{}\"", reduction);
  return sq;
}

}  // namespace weft::nn
