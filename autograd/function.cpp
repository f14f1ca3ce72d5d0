#include "autograd/function.h"

#include "core/grad_mode.h"

namespace weft::autograd {

TensorList Function::run(std::shared_ptr<Function> fn, const TensorList& inputs) {
  auto ctx = std::make_shared<FunctionCtx>();
  for (const Tensor& t : inputs) ctx->needs_input_grad.push_back(t.defined() && t.requires_grad());
  bool record_graph = needs_grad(inputs);
  TensorList outputs;
  {
    NoGradGuard no_grad;
    outputs = fn->forward(*ctx, inputs);
  }
  if (!record_graph) return outputs;
  // Outputs get fresh handles so that an output returned as-is (an identity) gets its own
  // grad_fn without touching the input's history.
  for (Tensor& o : outputs) o = o.detach();
  std::string name = fn->name();
  record(name, inputs, outputs, [fn, ctx, name, n = inputs.size()](const TensorList& grads) -> TensorList {
    TensorList g = fn->backward(*ctx, grads);
    WEFT_CHECK(g.size() == n, "{}: backward returned {} gradients for {} inputs", name, g.size(), n);
    return g;
  });
  return outputs;
}

}  // namespace weft::autograd
