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

void check_divides(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  WEFT_CHECK(x.size(dim) % group->size() == 0, "tp: dim {} of {} does not divide over {} ranks (a sequence-parallel "
             "sequence must be a multiple of the tensor-parallel size)", dim, tensor_desc(x), group->size());
}

Tensor my_block(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  check_divides(x, group, dim);
  const int64_t n = x.size(dim) / group->size();
  return x.narrow(dim, group->rank() * n, n).contiguous();
}

// Summed over the ranks, this rank's block along `dim` kept.
Tensor reduce_scattered(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  check_divides(x, group, dim);
  // [*before, P * n, *after] -> [P, *before, n, *after]: rank r's block contiguous at r.
  Shape split = x.shape();
  split[dim] /= group->size();
  split.insert(split.begin() + dim, group->size());
  Shape order = {dim};
  for (int64_t d = 0; d < int64_t(split.size()); ++d)
    if (d != dim) order.push_back(d);
  const Tensor blocks = x.reshape(split).permute(order).contiguous();
  Shape out_shape = x.shape();
  out_shape[dim] /= group->size();
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
  finish(group->reduce_scatter_tensor(out, blocks));
  return out;
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

// The same for a pair of collectives along a dim of x.
using Along = Tensor (*)(const Tensor&, const dist::ProcessGroupPtr&, int64_t);
Tensor apply_along(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim, const char* op, Along forward,
                   Along backward) {
  const int64_t d = wrap_dim(dim, x.dim(), op);
  return apply(x, group, op, [=](const Tensor& t) { return forward(t, group, d); },
               [=](const Tensor& g) { return backward(g, group, d); });
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
  return apply_along(x, group, dim, "gather_from_parallel", all_gathered, my_block);
}

Tensor scatter_to_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  return apply_along(x, group, dim, "scatter_to_parallel", my_block, all_gathered);
}

Tensor gather_sequence_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  return apply_along(x, group, dim, "gather_sequence_parallel", all_gathered, reduce_scattered);
}

Tensor reduce_scatter_parallel(const Tensor& x, const dist::ProcessGroupPtr& group, int64_t dim) {
  return apply_along(x, group, dim, "reduce_scatter_parallel", reduce_scattered, all_gathered);
}

}  // namespace weft::tp
