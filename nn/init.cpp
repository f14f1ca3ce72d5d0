#include "nn/init.h"

#include <cmath>

#include "core/grad_mode.h"

namespace weft::nn::init {

std::pair<int64_t, int64_t> fan_in_and_fan_out(const Tensor& t) {
  WEFT_CHECK(t.dim() >= 2, "init: fan in and fan out need a tensor of at least 2 dims, got {}", tensor_desc(t));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

double calculate_gain(std::string_view nl, double param) {
  if (nl == "linear" || nl == "sigmoid" || nl == "conv2d") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1 + param * param));
  WEFT_ERROR("calculate_gain: unknown nonlinearity \"{}\"", nl);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  NoGradGuard g;
  t.uniform_(low, high, gen);
  return t;
}
Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  NoGradGuard g;
  t.normal_(mean, std, gen);
  return t;
}
Tensor& constant_(Tensor& t, double value) {
  NoGradGuard g;
  t.fill_(value);
  return t;
}
Tensor& zeros_(Tensor& t) { return constant_(t, 0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1); }

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  auto [fi, fo] = fan_in_and_fan_out(t);
  double a = gain * std::sqrt(6.0 / double(fi + fo));
  return uniform_(t, -a, a, gen);
}
Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  auto [fi, fo] = fan_in_and_fan_out(t);
  return normal_(t, 0, gain * std::sqrt(2.0 / double(fi + fo)), gen);
}

static double kaiming_std(const Tensor& t, double a, std::string_view mode, std::string_view nl) {
  auto [fi, fo] = fan_in_and_fan_out(t);
  WEFT_CHECK(mode == "fan_in" || mode == "fan_out", "kaiming init: mode must be fan_in or fan_out, got \"{}\"", mode);
  int64_t fan = mode == "fan_in" ? fi : fo;
  WEFT_CHECK(fan > 0, "kaiming init: tensor {} has zero fan", tensor_desc(t));
  return calculate_gain(nl, a) / std::sqrt(double(fan));
}
Tensor& kaiming_uniform_(Tensor& t, double a, std::string_view mode, std::string_view nl, Generator* gen) {
  double bound = std::sqrt(3.0) * kaiming_std(t, a, mode, nl);
  return uniform_(t, -bound, bound, gen);
}
Tensor& kaiming_normal_(Tensor& t, double a, std::string_view mode, std::string_view nl, Generator* gen) {
  return normal_(t, 0, kaiming_std(t, a, mode, nl), gen);
}

}  // namespace weft::nn::init
