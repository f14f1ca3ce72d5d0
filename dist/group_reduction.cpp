#include "dist/group_reduction.h"

#include "core/tensor.h"

namespace weft::dist {
namespace {

class GroupReduction final : public PartialReduction {
 public:
  explicit GroupReduction(ProcessGroupPtr group) : group_(std::move(group)) {}

  double reduce(double partial, PartialOp op) const override {
    if (group_->device().is_meta()) return partial;  // a fake group (a memory plan): no values
    Tensor t = from_vector({partial}, {1}, {.dtype = kFloat64}).to(group_->device());
    group_->all_reduce(t, op == PartialOp::max ? ReduceOp::max : ReduceOp::sum)->wait();
    return t.to(kCPU).item();
  }

  bool same_processes(const PartialReduction& other) const override {
    auto* o = dynamic_cast<const GroupReduction*>(&other);
    return o && o->group_ == group_;
  }

 private:
  ProcessGroupPtr group_;
};

}  // namespace

std::shared_ptr<const PartialReduction> reduction_over(ProcessGroupPtr group) {
  return std::make_shared<GroupReduction>(std::move(group));
}

}  // namespace weft::dist
