#include "tp/split.h"

#include "dist/group_reduction.h"

namespace weft::tp {
namespace {

class SplitReduction final : public PartialReduction {
 public:
  SplitReduction(dist::ProcessGroupPtr group, Split split)
      : group_(group), split_(split), over_(dist::reduction_over(std::move(group))) {}
  double reduce(double partial, PartialOp op) const override { return over_->reduce(partial, op); }
  std::vector<double> gather(const std::vector<double>& local) const override { return over_->gather(local); }
  bool same_processes(const PartialReduction& other) const override {
    auto* o = dynamic_cast<const SplitReduction*>(&other);
    return o && o->group_ == group_;
  }
  const dist::ProcessGroupPtr& group() const { return group_; }
  const Split& split() const { return split_; }

 private:
  dist::ProcessGroupPtr group_;
  Split split_;
  std::shared_ptr<const PartialReduction> over_;
};

const SplitReduction* as_split(const std::shared_ptr<const PartialReduction>& r) {
  return dynamic_cast<const SplitReduction*>(r.get());
}

}  // namespace

Shape Split::whole_shape(Shape part_shape) const {
  if (split()) part_shape[size_t(dim)] *= parts;
  return part_shape;
}

std::shared_ptr<const PartialReduction> split_reduction(const dist::ProcessGroupPtr& group, int64_t dim,
                                                        int64_t chunks) {
  return std::make_shared<SplitReduction>(group, Split{dim, chunks, group->size(), group->rank()});
}

Split split_of(const std::shared_ptr<const PartialReduction>& reduction) {
  const SplitReduction* s = as_split(reduction);
  return s ? s->split() : Split{};
}

dist::ProcessGroupPtr split_group(const std::shared_ptr<const PartialReduction>& reduction) {
  const SplitReduction* s = as_split(reduction);
  return s ? s->group() : nullptr;
}

}  // namespace weft::tp
