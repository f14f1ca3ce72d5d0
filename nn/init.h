// nn: parameter initialisers, in place and seeded (default generator unless one is given),
// with PyTorch's formulas (fan-in/fan-out from the tensor's shape, gains as torch.nn.init).
#pragma once
#include <string_view>

#include "../core/generator.h"
#include "../core/tensor.h"

namespace weft::nn::init {

// fan_in = shape[1] * receptive field, fan_out = shape[0] * receptive field (>= 2-D tensors).
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& t);
// Recommended gain for a nonlinearity: "linear", "relu", "tanh", "leaky_relu" (param = slope).
double calculate_gain(std::string_view nonlinearity, double param = 0.01);

Tensor& uniform_(Tensor& t, double low = 0, double high = 1, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0, double std = 1, Generator* gen = nullptr);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
Tensor& constant_(Tensor& t, double value);
Tensor& xavier_uniform_(Tensor& t, double gain = 1, Generator* gen = nullptr);
Tensor& xavier_normal_(Tensor& t, double gain = 1, Generator* gen = nullptr);
// mode "fan_in" or "fan_out"; a is the leaky_relu slope used for the gain.
Tensor& kaiming_uniform_(Tensor& t, double a = 0, std::string_view mode = "fan_in",
                         std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);
Tensor& kaiming_normal_(Tensor& t, double a = 0, std::string_view mode = "fan_in",
                        std::string_view nonlinearity = "leaky_relu", Generator* gen = nullptr);

}  // namespace weft::nn::init
