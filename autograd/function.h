// autograd: user-defined differentiable functions. Subclass Function, implement forward
// (runs without recording; save what backward needs in ctx) and backward (gradients of the
// outputs -> gradients of the inputs), then call Function::apply<MyFn>(inputs, args...).
// FSDP uses identity Functions on module inputs to run code when their gradient is ready.
#pragma once
#include <memory>
#include <string>

#include "engine.h"
#include "node.h"

namespace weft::autograd {

struct FunctionCtx {
  TensorList saved;                    // tensors kept for backward
  std::vector<bool> needs_input_grad;  // per forward input
  void save_for_backward(TensorList tensors) { saved = std::move(tensors); }
};

class Function {
 public:
  virtual ~Function() = default;
  virtual std::string name() const { return "CustomFunction"; }
  virtual TensorList forward(FunctionCtx& ctx, const TensorList& inputs) = 0;
  virtual TensorList backward(FunctionCtx& ctx, const TensorList& grad_outputs) = 0;

  template <class F, class... Args>
  static TensorList apply(const TensorList& inputs, Args&&... args) {
    return run(std::make_shared<F>(std::forward<Args>(args)...), inputs);
  }
  static TensorList run(std::shared_ptr<Function> fn, const TensorList& inputs);
};

}  // namespace weft::autograd
