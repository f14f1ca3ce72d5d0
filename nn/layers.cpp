#include "nn/layers.h"

#include <cmath>

#include "autograd/ops.h"
#include "nn/init.h"

namespace weft::nn {

namespace {
// PyTorch's default for Linear and Conv: kaiming_uniform(a=sqrt(5)) on the weight, which is
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)), and the same bound for the bias.
Tensor default_weight(const Shape& shape, Generator* gen) {
  Tensor w = empty(shape);
  init::kaiming_uniform_(w, std::sqrt(5.0), "fan_in", "leaky_relu", gen);
  return w;
}
Tensor default_bias(int64_t n, int64_t fan_in, Generator* gen) {
  Tensor b = empty({n});
  double bound = fan_in > 0 ? 1.0 / std::sqrt(double(fan_in)) : 0.0;
  init::uniform_(b, -bound, bound, gen);
  return b;
}
// Constructor arguments are checked before any parameter is allocated, so a bad one is reported
// by the layer and argument name rather than by the factory that would allocate it.
int64_t at_least(int64_t v, int64_t lo, const char* layer, const char* arg) {
  WEFT_CHECK(v >= lo, "{}: {} must be >= {}, got {}", layer, arg, lo, v);
  return v;
}
double valid_eps(double e, const char* layer) {
  WEFT_CHECK(e >= 0 && std::isfinite(e), "{}: eps must be a finite number >= 0, got {}", layer, e);
  return e;
}
}  // namespace

Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator* gen)
    : Module("Linear"), in_features(at_least(in, 1, "Linear", "in_features")),
      out_features(at_least(out, 0, "Linear", "out_features")),
      weight(register_parameter("weight", default_weight({out, in}, gen))),
      bias(register_parameter("bias", with_bias ? default_bias(out, in, gen) : Tensor())) {}

Tensor Linear::forward(const Tensor& x) {
  if (!low_rank) return linear(x, weight, bias);
  const LowRank& l = *low_rank;
  // Adapters with hooks of their own (fsdp gathering them as a group apart from the base, which
  // learns from their inputs' gradients when backward is done with them) are called as modules.
  if (l.a->has_forward_hooks() || l.b->has_forward_hooks())
    return linear(x, weight, bias) + (*l.b)((*l.a)((*l.dropout)(x)) * l.scale);
  return low_rank_linear(x, (*l.dropout)(x), weight, bias, l.a->weight, l.b->weight, l.scale);
}
std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, bias.defined());
}

Embedding::Embedding(int64_t n, int64_t d, Generator* gen)
    : Module("Embedding"), num_embeddings(at_least(n, 0, "Embedding", "num_embeddings")),
      embedding_dim(at_least(d, 0, "Embedding", "embedding_dim")),
      weight(register_parameter("weight", randn({n, d}, {}, gen))) {}
Tensor Embedding::forward(const Tensor& indices) { return embedding(weight, indices); }
std::string Embedding::extra_repr() const { return fmt::format("{}, {}", num_embeddings, embedding_dim); }

LayerNorm::LayerNorm(int64_t d, double e, bool affine, bool with_bias)
    : Module("LayerNorm"), dim(at_least(d, 1, "LayerNorm", "dim")), eps(valid_eps(e, "LayerNorm")),
      weight(register_parameter("weight", affine ? ones({d}) : Tensor())),
      bias(register_parameter("bias", affine && with_bias ? zeros({d}) : Tensor())) {}
Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, {dim}, weight, bias, eps); }
std::string LayerNorm::extra_repr() const { return fmt::format("({},), eps={}", dim, eps); }

RMSNorm::RMSNorm(int64_t d, double e)
    : Module("RMSNorm"), dim(at_least(d, 1, "RMSNorm", "dim")), eps(valid_eps(e, "RMSNorm")),
      weight(register_parameter("weight", ones({d}))) {}
Tensor RMSNorm::forward(const Tensor& x) {
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == dim, "RMSNorm: input {} does not end in dim {}", tensor_desc(x), dim);
  return rms_norm(x, {dim}, weight, eps);
}
std::string RMSNorm::extra_repr() const { return fmt::format("({},), eps={}", dim, eps); }

Dropout::Dropout(double prob) : Module("Dropout"), p(prob) {
  WEFT_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1) (1 would zero everything and scale by 1/0), got {}", p);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training(), nullptr, block); }
std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
std::string GELU::extra_repr() const { return fmt::format("approximate='{}'", approximate); }

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, bool with_bias, Generator* gen)
    : Module("Conv2d"), in_channels(at_least(in, 1, "Conv2d", "in_channels")),
      out_channels(at_least(out, 1, "Conv2d", "out_channels")), kernel_size(at_least(k, 1, "Conv2d", "kernel_size")),
      stride(at_least(s, 1, "Conv2d", "stride")), padding(at_least(p, 0, "Conv2d", "padding")),
      weight(register_parameter("weight", default_weight({out, in, k, k}, gen))),
      bias(register_parameter("bias", with_bias ? default_bias(out, in * k * k, gen) : Tensor())) {}
Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, stride, padding); }
std::string Conv2d::extra_repr() const {
  return fmt::format("{}, {}, kernel_size=({}, {}), stride=({}, {}), padding=({}, {}), bias={}", in_channels,
                     out_channels, kernel_size, kernel_size, stride, stride, padding, padding, bias.defined());
}

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p)
    : Module("MaxPool2d"), kernel_size(at_least(k, 1, "MaxPool2d", "kernel_size")),
      stride(s == -1 ? k : at_least(s, 1, "MaxPool2d", "stride (or -1: kernel_size)")),
      padding(at_least(p, 0, "MaxPool2d", "padding")) {
  WEFT_CHECK(2 * padding <= kernel_size, "MaxPool2d: padding {} must be at most half of kernel_size {}", padding,
             kernel_size);
}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, kernel_size, stride, padding); }
std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", kernel_size, stride, padding);
}

Tensor Flatten::forward(const Tensor& x) { return x.flatten(start_dim, end_dim); }

}  // namespace weft::nn
