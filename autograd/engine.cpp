#include "autograd/engine.h"

#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/allocator.h"
#include "core/autograd_meta.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace weft::autograd {
namespace {

struct BackwardState {
  std::vector<std::function<void()>> callbacks;
};
thread_local BackwardState* g_current = nullptr;

// Gradient arriving at `node`'s input slot i: made to match the forward output's dtype and device, and checked for
// shape (only size-1 dims may differ), so a wrong backward formula fails loudly here instead of being reshaped.
Tensor validate_grad(const std::string& from, const Node& to, uint32_t slot, Tensor g) {
  const GradMeta& m = to.output_meta.at(slot);
  auto without_ones = [](Shape s) { std::erase(s, int64_t(1)); return s; };
  if (g.shape() != m.shape) {
    WEFT_CHECK(without_ones(g.shape()) == without_ones(m.shape),
               "backward: {} returned a gradient of shape {} for an input of shape {}",
               from, shape_str(g.shape()), shape_str(m.shape));
    g = g.reshape(m.shape);
  }
  if (g.dtype() != m.dtype || g.device() != m.device) g = g.to(m.device, m.dtype);
  return g;
}

void run_backward(const TensorList& roots, const TensorList& root_grads, bool retain_graph) {
  NoGradGuard no_grad;
  // Roots' gradients enter the graph through a virtual node with one edge per root.
  std::vector<Edge> root_edges;
  for (const Tensor& r : roots) {
    Edge e = gradient_edge(r);
    WEFT_CHECK(e.valid(), "backward: tensor {} does not require grad and has no grad_fn", tensor_desc(r));
    root_edges.push_back(e);
  }
  // Count, for every reachable node, how many gradient edges point into it.
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (auto& e : root_edges) {
    ++deps[e.fn.get()];
    if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::unordered_map<Node*, TensorList> buffers;
  auto cmp = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr() < b->sequence_nr();
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(cmp)> ready(cmp);

  auto deliver = [&](const std::string& from, const Edge& e, Tensor g) {
    Node* to = e.fn.get();
    TensorList& buf = buffers[to];
    if (buf.empty()) buf.resize(to->output_meta.size());
    if (g.defined()) {
      g = validate_grad(from, *to, e.input_nr, std::move(g));
      Tensor& slot = buf[e.input_nr];
      if (!slot.defined()) {
        slot = std::move(g);
      } else if (exclusive(slot) && slot.dtype() == g.dtype() && slot.shape() == g.shape()) {
        kernels::add_(slot, g);  // nothing else can see the sum so far: add in place, no new buffer
      } else {
        slot = kernels::binary(kernels::BinaryOp::add, slot, g);
      }
    }
    if (--deps[to] == 0) ready.push(e.fn);
  };

  for (size_t i = 0; i < roots.size(); ++i) deliver("backward root", root_edges[i], root_grads[i]);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    TensorList grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(node->output_meta.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        const GradMeta& m = node->output_meta[i];
        grads[i] = zeros(m.shape, {.dtype = m.dtype, .device = m.device});
      }
    }
    for (auto& [nr, hook] : node->tensor_pre_hooks) {
      const Tensor& g = grads[nr];
      Tensor r = hook(g);
      WEFT_CHECK(!r.defined() || (r.shape() == g.shape() && r.dtype() == g.dtype() && r.device() == g.device()),
                 "backward: a hook on output {} of {} returned {} for its gradient {}", nr, node->name(),
                 tensor_desc(r), tensor_desc(g));
      if (r.defined()) grads[nr] = r;
    }
    for (auto& [nr, weak] : node->retained) {  // summed over backward calls, as a leaf's (and PyTorch's) are
      if (auto impl = weak.lock()) {
        Tensor& g = Tensor(impl).autograd_meta().grad;
        g = g.defined() ? kernels::binary(kernels::BinaryOp::add, g, grads[nr]) : grads[nr].clone();
      }
    }
    // Names the gradients and temporaries in out-of-memory reports, while a limit is set.
    const std::string owner = MemoryOwner::wanted() ? "backward of " + node->name() : std::string();
    std::optional<MemoryOwner> owning;
    if (!owner.empty()) owning.emplace(owner);
    TensorList out = node->apply(std::move(grads));
    owning.reset();
    WEFT_CHECK(out.size() == node->next_edges.size() || out.empty(),
               "backward: {} returned {} gradients for {} inputs", node->name(), out.size(),
               node->next_edges.size());
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      deliver(node->name(), e, i < out.size() ? out[i] : Tensor());
    }
    // Saved activations go as soon as their node has run (not at the end of the backward),
    // so the backward's peak holds only the activations still ahead of it.
    if (!retain_graph) node->release_saved();
  }
}

// Entry points core's Tensor methods reach through detail::autograd_hooks().
void hook_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  Engine::backward(root, grad, retain_graph);
}

void hook_register(const Tensor& t, GradHook hook) {
  AutogradMeta& meta = t.autograd_meta();
  if (meta.grad_fn) meta.grad_fn->tensor_pre_hooks.emplace_back(meta.output_nr, std::move(hook));
  else meta.leaf_hooks.push_back(std::move(hook));
}

void hook_retain_grad(const Tensor& t) {
  AutogradMeta& meta = t.autograd_meta();
  if (meta.retains_grad) return;
  meta.retains_grad = true;
  meta.grad_fn->retained.emplace_back(meta.output_nr, t.impl_ptr());
}

}  // namespace

void Engine::backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  backward(TensorList{root}, TensorList{grad}, retain_graph);
}

void Engine::backward(const TensorList& roots, const TensorList& grads, bool retain_graph) {
  WEFT_CHECK(roots.size() == grads.size(), "backward: {} roots but {} gradients", roots.size(), grads.size());
  TensorList root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    WEFT_CHECK(r.defined(), "backward: root {} is an undefined tensor", i);
    WEFT_CHECK(r.requires_grad(), "backward: tensor {} does not require grad and has no grad_fn",
               tensor_desc(r));
    if (grads[i].defined()) {
      WEFT_CHECK(grads[i].shape() == r.shape(), "backward: gradient {} does not match root {}",
                 tensor_desc(grads[i]), tensor_desc(r));
      root_grads.push_back(grads[i].detach());
    } else {
      WEFT_CHECK(r.numel() == 1,
                 "backward: gradient can be implicitly created only for scalar outputs, but the "
                 "root is {}; pass a gradient", tensor_desc(r));
      root_grads.push_back(ones(r.shape(), {.dtype = r.dtype(), .device = r.device()}));
    }
  }
  if (g_current != nullptr) {
    // Re-entrant: a node's backward runs a backward of its own (activation checkpointing recomputes its forward and
    // backpropagates through it). Callbacks it queues belong to the outer pass and run when that one ends.
    run_backward(roots, root_grads, retain_graph);
    return;
  }
  BackwardState state;
  g_current = &state;
  try {
    run_backward(roots, root_grads, retain_graph);
    // Callbacks may queue further callbacks; run until none are left.
    for (size_t i = 0; i < state.callbacks.size(); ++i) {
      auto cb = std::move(state.callbacks[i]);
      cb();
    }
  } catch (...) {
    g_current = nullptr;
    throw;
  }
  g_current = nullptr;
}

void Engine::queue_callback(std::function<void()> callback) {
  WEFT_CHECK(g_current != nullptr, "queue_callback: no backward pass is running");
  g_current->callbacks.push_back(std::move(callback));
}

bool Engine::is_running() { return g_current != nullptr; }

namespace detail {
void install_view_hooks(weft::detail::AutogradHooks& hooks);  // autograd/view_backward.cpp

bool install_autograd_hooks() {
  static const bool done = [] {
    auto& h = weft::detail::autograd_hooks();
    h.backward = &hook_backward;
    h.register_hook = &hook_register;
    h.retain_grad = &hook_retain_grad;
    install_view_hooks(h);
    return true;
  }();
  return done;
}
}  // namespace detail

}  // namespace weft::autograd
