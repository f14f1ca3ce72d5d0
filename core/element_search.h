// core: finding an element of a tensor by its value, for checks that must say what they found
// and where (a NaN in a checkpoint, a negative second moment in optimizer state).
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "tensor.h"

namespace weft {

struct FoundElement {
  int64_t index = 0;  // flat, in logical (row-major) order
  double value = 0;
  std::string str() const;  // "nan at element 3"
};

// The first element of `t` for which `bad` holds; none for a non-floating dtype or a meta
// tensor. Reads `t` on the host as f64, one slice at a time.
std::optional<FoundElement> find_element(const Tensor& t, const std::function<bool(double)>& bad);

// The first NaN or infinity of `t`.
std::optional<FoundElement> find_nonfinite(const Tensor& t);

}  // namespace weft
