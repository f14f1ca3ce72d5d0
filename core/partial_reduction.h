// core: how a reduction over a parameter's elements is completed when this process holds only part of them.
// [Note: partial reductions] The dependency points down although the knowledge sits above: nn (clip_grad_norm_) must
// total a norm over every rank's shard, but nn may not know fsdp or dist. So the layer that shards
// (fsdp/fully_shard.cpp) attaches a PartialReduction to each shard it registers, one that knows its process group, the
// way a DTensor carries its placement in PyTorch; nn reduces its local part, then lets the parameter's
// PartialReduction combine the parts of every process that holds one, through this core interface, without knowing
// how. A tensor without one is held whole.
#pragma once
#include <memory>
#include <vector>

namespace weft {

class Tensor;

enum class PartialOp { sum, max };

class PartialReduction {
 public:
  virtual ~PartialReduction() = default;
  // `partial` combined over every process holding a part of the tensor (a collective: each of
  // them calls it, in the same order as its other collectives).
  virtual double reduce(double partial, PartialOp op) const = 0;
  // Every process's `local` values, concatenated in the processes' rank order (a collective; the lengths may differ).
  virtual std::vector<double> gather(const std::vector<double>& local) const = 0;
  // Whether `other` combines over the same processes, so that one reduce() serves both.
  virtual bool same_processes(const PartialReduction& other) const = 0;
};

// Attaches `reduction` to the leaf tensor `t` (null: held whole again).
void set_partial_reduction(const Tensor& t, std::shared_ptr<const PartialReduction> reduction);
// `t`'s PartialReduction; null when it is held whole.
std::shared_ptr<const PartialReduction> partial_reduction(const Tensor& t);

}  // namespace weft
