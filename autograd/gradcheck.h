// autograd: checking backward formulas against finite differences. gradcheck compares
// d(sum(fn(inputs) * v))/d(input) from backward with central differences, for a fixed random
// v, on f64 inputs; it reports the first element that differs.
#pragma once
#include <functional>
#include <string>

#include "node.h"

namespace weft::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 1234;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // empty when ok; else names the input, element and both values
  explicit operator bool() const { return ok; }
};

// `inputs` are f64 leaves (some may not require grad); `fn` may build views of them.
GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& fn, const TensorList& inputs,
                          GradcheckOptions opts = {});

}  // namespace weft::autograd
