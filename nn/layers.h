// nn: the basic layers. Parameters are created in the layer's constructor and initialised
// as PyTorch does (seeded from the default generator, or `gen` when given).
#pragma once
#include "../kernels/nn.h"  // RandomBlock
#include "module.h"

namespace weft::nn {

// y = x W^T + b, W [out, in]; init: kaiming_uniform(a=sqrt(5)) for W, U(-1/sqrt(in), 1/sqrt(in)) for b.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t in_features, out_features;
  Tensor& weight;
  Tensor& bias;  // undefined when bias = false
  // A low-rank adapter that forward adds, y += scale * B(A(dropout(x))), in one node with the
  // product (low_rank_linear): set by apply_lora (nn/lora.h); the adapters are this one's children.
  struct LowRank {
    std::shared_ptr<Linear> a, b;
    std::shared_ptr<Module> dropout;
    double scale;
  };
  std::optional<LowRank> low_rank;
};

// Lookup table [num_embeddings, dim], init N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t num_embeddings, embedding_dim;
  Tensor& weight;
};

// Layer norm over the last dim (weight 1, bias 0).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t dim;
  double eps;
  Tensor& weight;
  Tensor& bias;
};

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dim.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t dim;
  double eps;
  Tensor& weight;
};

// Zeroes elements with probability p in training mode (scaled by 1/(1-p)); identity in eval.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  double p;
  kernels::RandomBlock block;  // its input as a part of a whole tensor (tp: a split one), drawing the whole's masks
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override;
  using Module::forward;
};

class GELU : public Module {
 public:
  explicit GELU(std::string approximate = "none") : Module("GELU"), approximate(std::move(approximate)) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  std::string approximate;
};

// NCHW convolution with square kernel, stride and padding; init as Linear with fan_in = C*k*k.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t in_channels, out_channels, kernel_size, stride, padding;
  Tensor& weight;
  Tensor& bias;
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = -1, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  using Module::forward;
  int64_t kernel_size, stride, padding;
};

// Flattens dims start_dim..end_dim (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override;
  using Module::forward;
  int64_t start_dim, end_dim;
};

}  // namespace weft::nn
