// nn: loss functions (reduction "mean", "sum" or "none", as torch.nn.functional).
#pragma once
#include <string_view>

#include "../autograd/ops.h"

namespace weft::nn {

// Fused log-softmax + NLL over logits [N, C] (or [C]) and class targets [N]; see
// weft::cross_entropy and CrossEntropyOptions (ignore_index, label_smoothing, reduction).
using weft::cross_entropy;
using weft::CrossEntropyOptions;

// (input - target)^2, reduced; shapes must match exactly.
Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction = "mean");

}  // namespace weft::nn
