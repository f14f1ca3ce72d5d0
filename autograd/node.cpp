#include "autograd/node.h"

#include <atomic>

#include "core/allocator.h"
#include "core/autograd_meta.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"

namespace weft::autograd {

static std::atomic<uint64_t> g_next_sequence_nr{0};

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(g_next_sequence_nr++) {}

TensorList FunctionNode::apply(TensorList&& grad_outputs) {
  WEFT_CHECK(!released_,
             "backward: trying to backward through {} a second time, but its saved tensors were "
             "freed by the first backward; pass retain_graph=true to the first backward", name_);
  for (size_t i = 0; i < input_versions.size(); ++i)
    if (auto s = input_versions[i].first.lock(); s && s->version != input_versions[i].second)
      WEFT_ERROR("backward: input {} of {} was written in place after the forward used it (its storage's version {} "
                 "-> {}), so its gradient would be computed from other values: write into a copy, or after backward",
                 i, name_, input_versions[i].second, s->version);
  for (size_t i = 0; i < output_versions.size(); ++i)
    if (auto s = output_versions[i].first.lock(); s && s->version != output_versions[i].second)
      WEFT_ERROR("backward: the output of {} was written in place after the forward made it (its storage's version {} "
                 "-> {}), and its backward reads it, so its gradient would be computed from other values: write into "
                 "a copy (clone), or after backward", name_, output_versions[i].second, s->version);
  return fn_(grad_outputs);
}

void FunctionNode::reads_outputs(const TensorList& outputs) {
  for (const Tensor& t : outputs)
    if (t.defined()) output_versions.emplace_back(t.storage(), t.storage()->version);
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  sequence_nr_ = UINT64_MAX;  // accumulate as soon as ready, before other ready nodes
  output_meta.push_back({leaf_.shape(), leaf_.dtype(), leaf_.device()});
}

TensorList AccumulateGrad::apply(TensorList&& grad_outputs) {
  Tensor g = std::move(grad_outputs[0]);
  AutogradMeta& meta = leaf_.autograd_meta();
  WEFT_CHECK(leaf_.dtype() == output_meta[0].dtype && leaf_.device() == output_meta[0].device, "backward: {} was "
             "{} on {} when the forward used it (a Module::to between the forward and this backward): run the forward "
             "again", tensor_desc(leaf_), dtype_name(output_meta[0].dtype), output_meta[0].device.str());
  for (auto& hook : meta.leaf_hooks) {
    Tensor r = hook(g);
    WEFT_CHECK(!r.defined() || (r.shape() == g.shape() && r.dtype() == g.dtype() && r.device() == g.device()),
               "backward: a hook of {} returned {} for its gradient {}", tensor_desc(leaf_), tensor_desc(r),
               tensor_desc(g));
    if (r.defined()) g = r;
  }
  if (!meta.grad.defined()) {
    // Take the incoming buffer when nothing else can see it, else copy it.
    meta.grad = exclusive(g) ? g.detach() : g.detach().clone();
    if (MemoryOwner::wanted() && meta.grad.numel() > 0)  // named for memory reports and plans
      allocator_for(meta.grad.device()).label(meta.grad.storage()->data_or_null(), "gradients");
  } else {
    bool expanded = false;  // a gradient set as an expanded view (set_grad) takes no sum in place
    for (int64_t d = 0; d < meta.grad.dim(); ++d) expanded |= meta.grad.stride(d) == 0 && meta.grad.size(d) > 1;
    if (expanded) meta.grad = kernels::binary(kernels::BinaryOp::add, meta.grad, g);
    else kernels::add_(meta.grad, g);
  }
  for (auto& hook : meta.post_accumulate_grad_hooks) hook(leaf_);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  auto acc = meta.grad_accumulator.lock();
  if (!acc) {
    // The AccumulateGrad holds the leaf through its own handle so hooks see the same tensor.
    acc = std::make_shared<AccumulateGrad>(Tensor(t.impl_ptr()));
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool needs_grad(const TensorList& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

std::shared_ptr<FunctionNode> record(std::string name, const TensorList& inputs,
                                     const TensorList& outputs, FunctionNode::BackwardFn fn) {
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(fn));
  node->next_edges.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    node->next_edges.push_back(gradient_edge(t));
    if (t.defined()) node->input_versions.emplace_back(t.storage(), t.storage()->version);
    else node->input_versions.emplace_back();
  }
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    node->output_meta.push_back({out.shape(), out.dtype(), out.device()});
    if (!is_floating(out.dtype())) continue;  // an integer or bool result (a cast, indices) is not differentiable
    AutogradMeta& meta = out.autograd_meta();
    meta.grad_fn = node;
    meta.output_nr = i;
    meta.requires_grad = false;
  }
  return node;
}

}  // namespace weft::autograd
