// core: element-addressable fills. A FillRule says how every element of a tensor is computed from its row-major index
// alone (a constant, or a uniform / normal draw from the counter-based generator at counter `offset + index`), so any
// slice of a tensor's values can be written without the rest. Eager fills (Tensor::uniform_, normal_, fill_) compute
// through it; on the meta device the same calls only record it on the tensor's storage, and materialising the tensor
// later (whole, or one rank's shard) computes the values the eager fill would have written, bit for bit.
#pragma once
#include <memory>
#include <string>

#include "tensor.h"

namespace weft {

struct FillRule {
  // none: no values, for a tensor a load writes whole next: materialised as allocated (a shard's padding zeroed).
  enum class Kind : uint8_t { constant, uniform, normal, none };
  Kind kind = Kind::constant;
  double a = 0, b = 0;  // constant: value a; uniform: [a, b); normal: mean a, std b
  uint64_t seed = 0, offset = 0;  // random kinds: element i draws from counter offset + i

  // The value of element `index` (row-major) before conversion to the tensor's dtype.
  double value(int64_t index) const;
  std::string str() const;  // "uniform(-0.1, 0.1; seed 0, counter 1536)", for messages
};

// Writes the rule's values into `dst`, a slice of a tensor of `full_shape`: the elements whose
// index on `dim` lies in [start, start + dst.size(dim)) (all of them on the other dims). Only
// those elements are computed. `full_shape` may be empty (a 0-dim tensor: dst is [1] or []).
void fill_slice(const Tensor& dst, const FillRule& rule, const Shape& full_shape, int64_t dim = 0, int64_t start = 0);

// A meta tensor's recorded rule (null when it has none: a tensor never filled, which
// materialises as zeros). Throws unless `t` is on the meta device.
std::shared_ptr<const FillRule> recorded_fill(const Tensor& t);
// Records `rule` for the meta tensor `t`, which must cover its whole storage (a fill of part of
// a meta tensor cannot be deferred: clear error naming `op`).
void record_fill(const Tensor& t, const FillRule& rule, const char* op);

// A new contiguous tensor on `device` holding the values of the meta tensor `t`.
Tensor materialize_tensor(const Tensor& t, Device device);
// Materialises the meta tensor `t` in place: its TensorImpl gets storage on `device` holding
// its values, so every handle to it (tied slots, optimizers' lists) sees the real tensor.
void materialize_in_place(const Tensor& t, Device device);

}  // namespace weft
