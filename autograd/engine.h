// autograd: the backward engine. Runs the graph from a root in dependency order (most
// recently recorded node first among the ready ones), accumulating gradients into leaves.
#pragma once
#include <functional>

#include "node.h"

namespace weft::autograd {

class Engine {
 public:
  // Backward from `root`. `grad` may be omitted for a one-element root (ones). Unless retain_graph, saved tensors are
  // freed as nodes run, so a second backward through the same graph is an error.
  static void backward(const Tensor& root, const Tensor& grad = {}, bool retain_graph = false);
  static void backward(const TensorList& roots, const TensorList& grads, bool retain_graph = false);
  // A backward started from inside a running one (a node's backward, e.g. nn::checkpoint's recompute) runs its graph at
  // once; its queued callbacks run when the outer pass ends. Runs `callback` once after the current backward pass has
  // finished running nodes (and before backward() returns). Only valid while a backward is running.
  static void queue_callback(std::function<void()> callback);
  static bool is_running();
};

}  // namespace weft::autograd

namespace weft::autograd::detail {
// Connects core's Tensor methods (backward, hooks, views, copies) to this engine. Every
// translation unit that includes this header calls it, so the engine is always linked in.
bool install_autograd_hooks();
inline const bool g_autograd_installed = install_autograd_hooks();
}  // namespace weft::autograd::detail
