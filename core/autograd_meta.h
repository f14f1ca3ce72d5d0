// core: the autograd state a tensor carries, and the entry points autograd installs so that core's own methods (views,
// copies, backward, hooks) take part in graphs. Core stores this data; the logic that reads it is in autograd/.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "partial_reduction.h"
#include "tensor.h"

namespace weft {

template <class T>
struct AttachmentKey {};  // a kind of AutogradMeta attachment: a static object of the attaching layer

struct AutogradMeta {
  bool requires_grad = false;               // set on leaves by the user
  std::shared_ptr<autograd::Node> grad_fn;  // set on results of recorded ops
  uint32_t output_nr = 0;                   // which output of grad_fn this tensor is
  Tensor grad;                              // accumulated gradient (leaves, retain_grad)
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the node that accumulates grad
  std::vector<GradHook> leaf_hooks;                 // leaves: run before accumulation
  std::vector<PostAccumulateGradHook> post_accumulate_grad_hooks;
  bool retains_grad = false;
  std::shared_ptr<const PartialReduction> partial_reduction;  // leaves held in part (core/partial_reduction.h)
  // What layers above core attach to a tensor, each under its own key; core never reads it.
  std::map<const void*, std::shared_ptr<void>> attachments;
  template <class T>
  void attach(const AttachmentKey<T>& key, T value) { attachments[&key] = std::make_shared<T>(std::move(value)); }
  template <class T>
  const T* attached(const AttachmentKey<T>& key) const {
    auto it = attachments.find(&key);
    return it == attachments.end() ? nullptr : static_cast<const T*>(it->second.get());
  }
};

namespace detail {

using ViewReplay = std::function<Tensor(const Tensor&)>;

// Installed once by autograd (see autograd/engine.cpp). Core calls these only when a tensor
// takes part in autograd, so core alone never records anything.
struct AutogradHooks {
  // `out` is a view of `base` (which requires grad): give `out` a grad_fn. `replay` applies
  // the same view to another tensor shaped like base (null for as_strided).
  void (*record_view)(const Tensor& base, Tensor& out, const ViewReplay& replay) = nullptr;
  // `out` is a copy of `src` (contiguous/clone/to): give `out` a grad_fn.
  void (*record_copy)(const Tensor& src, Tensor& out) = nullptr;
  void (*backward)(const Tensor& root, const Tensor& grad, bool retain_graph) = nullptr;
  void (*register_hook)(const Tensor& t, GradHook hook) = nullptr;
  void (*retain_grad)(const Tensor& t) = nullptr;
};
AutogradHooks& autograd_hooks();

}  // namespace detail
}  // namespace weft
