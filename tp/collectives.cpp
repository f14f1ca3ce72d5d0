#include "tp/collectives.h"

#include "autograd/function.h"
#include "core/shape.h"
#include "dist/process_group.h"

namespace weft::tp {
namespace {

using autograd::FunctionCtx;
using autograd::TensorList;

void finish(const dist::WorkPtr& work) {
  if (!work->wait_on_current_stream()) work->wait();
}

Tensor all_reduced(const Tensor& x, const dist::ProcessGroupPtr& group) {
  if (!x.defined()) return x;
  Tensor y = x.clone();
  finish(group->all_reduce(y));
  return y;
}

// [*before, n, *after] on every rank -> [*before, ranks * n, *after], rank r's at r * n.
Tensor all_gathered(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  Shape stacked = x.shape();
  stacked.insert(stacked.begin(), group->size());
  Tensor out = empty(stacked, {.dtype = x.dtype(), .device = x.device()});
  finish(group->all_gather_into_tensor(out, x.contiguous()));
  // [ranks, *before, n, *after] -> [*before, ranks, n, *after] -> joined.
  Shape order;
  for (int64_t d = 1; d <= dim; ++d) order.push_back(d);
  order.push_back(0);
  for (int64_t d = dim + 1; d <= x.dim(); ++d) order.push_back(d);
  Shape joined = x.shape();
  joined[dim] *= group->size();
  return out.permute(order).reshape(joined);
}

class CopyToParallel : public autograd::Function {
 public:
  explicit CopyToParallel(dist::ProcessGroupPtr g) : group_(std::move(g)) {}
  std::string name() const override { return "CopyToParallel"; }
  TensorList forward(FunctionCtx&, const TensorList& in) override { return in; }
  TensorList backward(FunctionCtx&, const TensorList& grads) override { return {all_reduced(grads[0], group_)}; }

 private:
  dist::ProcessGroupPtr group_;
};

class ReduceFromParallel : public autograd::Function {
 public:
  explicit ReduceFromParallel(dist::ProcessGroupPtr g) : group_(std::move(g)) {}
  std::string name() const override { return "ReduceFromParallel"; }
  TensorList forward(FunctionCtx&, const TensorList& in) override { return {all_reduced(in[0], group_)}; }
  TensorList backward(FunctionCtx&, const TensorList& grads) override { return grads; }

 private:
  dist::ProcessGroupPtr group_;
};

class GatherFromParallel : public autograd::Function {
 public:
  GatherFromParallel(dist::ProcessGroupPtr g, int64_t dim) : group_(std::move(g)), dim_(dim) {}
  std::string name() const override { return "GatherFromParallel"; }
  TensorList forward(FunctionCtx&, const TensorList& in) override { return {all_gathered(in[0], group_, dim_)}; }
  TensorList backward(FunctionCtx&, const TensorList& grads) override {
    if (!grads[0].defined()) return grads;
    const int64_t n = grads[0].size(dim_) / group_->size();
    return {grads[0].narrow(dim_, group_->rank() * n, n).contiguous()};
  }

 private:
  dist::ProcessGroupPtr group_;
  int64_t dim_;
};

void check_group(const dist::ProcessGroupPtr& group, const char* op) {
  WEFT_CHECK(group != nullptr, "tp::{}: no process group", op);
}

}  // namespace

Tensor copy_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group) {
  check_group(group, "copy_to_parallel");
  return autograd::Function::apply<CopyToParallel>({x}, group)[0];
}

Tensor reduce_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group) {
  check_group(group, "reduce_from_parallel");
  return autograd::Function::apply<ReduceFromParallel>({x}, group)[0];
}

Tensor gather_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  check_group(group, "gather_from_parallel");
  const int64_t d = wrap_dim(dim, x.dim(), "tp::gather_from_parallel");
  return autograd::Function::apply<GatherFromParallel>({x}, group, d)[0];
}

}  // namespace weft::tp
