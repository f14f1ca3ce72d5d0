#include "apps/mnist/models.h"

#include "autograd/ops.h"

namespace weft::apps {

MnistMLP::MnistMLP(int64_t pixels) : nn::Module("MnistMLP") {
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(pixels, 512));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(512, 256));
  fc3 = register_module("fc3", std::make_shared<nn::Linear>(256, 10));
}

Tensor MnistMLP::forward(const Tensor& x) { return (*fc3)(relu((*fc2)(relu((*fc1)(x))))); }

MnistCNN::MnistCNN(int64_t r, int64_t c) : nn::Module("MnistCNN"), rows(r), cols(c) {
  // Two 2x2 poolings: smaller images would leave fc1 nothing to read.
  WEFT_CHECK(r >= 4 && c >= 4, "mnist: the cnn model pools twice by 2, so it needs images of at least 4x4 pixels; "
             "these are {}x{} (use --model mlp)", r, c);
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(1, 32, 3, 1, 1));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(32, 64, 3, 1, 1));
  fc1 = register_module("fc1", std::make_shared<nn::Linear>(64 * (r / 4) * (c / 4), 128));
  fc2 = register_module("fc2", std::make_shared<nn::Linear>(128, 10));
}

Tensor MnistCNN::forward(const Tensor& x) {
  Tensor h = x.view({x.size(0), 1, rows, cols});
  h = max_pool2d(relu((*conv1)(h)), 2);
  h = max_pool2d(relu((*conv2)(h)), 2);
  return (*fc2)(relu((*fc1)(h.flatten(1))));
}

nn::ModulePtr make_mnist_model(const std::string& name, int64_t rows, int64_t cols) {
  if (name == "mlp") return std::make_shared<MnistMLP>(rows * cols);
  if (name == "cnn") return std::make_shared<MnistCNN>(rows, cols);
  WEFT_ERROR("mnist: unknown model \"{}\" (choose mlp or cnn)", name);
}

}  // namespace weft::apps
