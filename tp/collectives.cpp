#include "tp/collectives.h"

#include <functional>
#include <string>
#include <utility>

#include "autograd/function.h"
#include "core/shape.h"

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

// One differentiable collective: `forward` on the input, `backward` on the output's gradient.
class ParallelOp : public autograd::Function {
 public:
  using Map = std::function<Tensor(const Tensor&)>;
  ParallelOp(std::string name, Map forward, Map backward)
      : name_(std::move(name)), forward_(std::move(forward)), backward_(std::move(backward)) {}
  std::string name() const override { return name_; }
  TensorList forward(FunctionCtx&, const TensorList& in) override { return {forward_(in[0])}; }
  TensorList backward(FunctionCtx&, const TensorList& grads) override {
    return {grads[0].defined() ? backward_(grads[0]) : grads[0]};
  }

 private:
  std::string name_;
  Map forward_, backward_;
};

Tensor apply(const Tensor& x, const dist::ProcessGroupPtr& group, const char* op, ParallelOp::Map forward,
             ParallelOp::Map backward) {
  WEFT_CHECK(group != nullptr, "tp::{}: no process group", op);
  return autograd::Function::apply<ParallelOp>({x}, op, std::move(forward), std::move(backward))[0];
}

}  // namespace

Tensor copy_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group) {
  return apply(x, group, "copy_to_parallel", [](const Tensor& t) { return t; },
               [group](const Tensor& g) { return all_reduced(g, group); });
}

Tensor reduce_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group) {
  return apply(x, group, "reduce_from_parallel", [group](const Tensor& t) { return all_reduced(t, group); },
               [](const Tensor& g) { return g; });
}

Tensor gather_from_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  const int64_t d = wrap_dim(dim, x.dim(), "tp::gather_from_parallel");
  return apply(x, group, "gather_from_parallel", [group, d](const Tensor& t) { return all_gathered(t, group, d); },
               [group, d](const Tensor& g) {
                 const int64_t n = g.size(d) / group->size();
                 return g.narrow(d, group->rank() * n, n).contiguous();
               });
}

}  // namespace weft::tp
