// apps/mnist: the two classifiers — an MLP (784-512-256-10) and a small CNN
// (conv 32, pool, conv 64, pool, linear 128, linear 10) — for 28x28 inputs flattened to 784.
#pragma once
#include <string>

#include "nn/nn.h"

namespace weft::apps {

class MnistMLP : public nn::Module {
 public:
  explicit MnistMLP(int64_t pixels = 784);
  Tensor forward(const Tensor& x) override;
  using nn::Module::forward;
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
};

class MnistCNN : public nn::Module {
 public:
  MnistCNN(int64_t rows = 28, int64_t cols = 28);
  Tensor forward(const Tensor& x) override;  // x [N, rows*cols]
  using nn::Module::forward;
  int64_t rows, cols;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// "mlp" or "cnn"; anything else is an error naming the choices.
nn::ModulePtr make_mnist_model(const std::string& name, int64_t rows, int64_t cols);

}  // namespace weft::apps
