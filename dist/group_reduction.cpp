#include "dist/group_reduction.h"

#include <algorithm>

#include "core/tensor.h"

namespace weft::dist {
namespace {

class GroupReduction final : public PartialReduction {
 public:
  GroupReduction(ProcessGroupPtr group, std::shared_ptr<const PartialReduction> then)
      : group_(std::move(group)), then_(std::move(then)) {}

  double reduce(double partial, PartialOp op) const override {
    const double here = reduce_here(partial, op);
    return then_ ? then_->reduce(here, op) : here;
  }

  std::vector<double> gather(const std::vector<double>& local) const override {
    return then_ ? then_->gather(gather_here(local)) : gather_here(local);
  }

  bool same_processes(const PartialReduction& other) const override {
    auto* o = dynamic_cast<const GroupReduction*>(&other);
    return o && o->group_ == group_ && (o->then_ && then_ ? then_->same_processes(*o->then_) : !o->then_ && !then_);
  }

 private:
  double reduce_here(double partial, PartialOp op) const {
    if (group_->device().is_meta()) return partial;  // a fake group (a memory plan): no values
    Tensor t = from_vector({partial}, {1}, {.dtype = kFloat64}).to(group_->device());
    group_->all_reduce(t, op == PartialOp::max ? ReduceOp::max : ReduceOp::sum)->wait();
    return t.to(kCPU).item();
  }

  std::vector<double> gather_here(const std::vector<double>& local) const {
    if (group_->device().is_meta()) return local;
    const int n = group_->size();
    // The lengths first, then every process's values padded to the longest.
    Tensor len = from_vector({double(local.size())}, {1}, {.dtype = kFloat64}).to(group_->device());
    Tensor lens = empty({n}, {.dtype = kFloat64, .device = group_->device()});
    group_->all_gather_into_tensor(lens, len)->wait();
    const std::vector<double> count = to_vector(lens.to(kCPU));
    const int64_t longest = int64_t(*std::max_element(count.begin(), count.end()));
    std::vector<double> padded(local);
    padded.resize(size_t(longest), 0.0);
    Tensor mine = from_vector(padded, {longest}, {.dtype = kFloat64}).to(group_->device());
    Tensor all = empty({n * longest}, {.dtype = kFloat64, .device = group_->device()});
    group_->all_gather_into_tensor(all, mine)->wait();
    const std::vector<double> values = to_vector(all.to(kCPU));
    std::vector<double> out;
    for (int r = 0; r < n; ++r)
      out.insert(out.end(), values.begin() + r * longest, values.begin() + r * longest + int64_t(count[size_t(r)]));
    return out;
  }

  ProcessGroupPtr group_;
  std::shared_ptr<const PartialReduction> then_;
};

}  // namespace

std::shared_ptr<const PartialReduction> reduction_over(ProcessGroupPtr group, std::shared_ptr<const PartialReduction> then) {
  return std::make_shared<GroupReduction>(std::move(group), std::move(then));
}

}  // namespace weft::dist
