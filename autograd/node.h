// autograd: graph nodes. A Node is the backward of one recorded operation: it takes the
// gradients of the op's outputs and returns the gradients of its inputs, which flow along
// next_edges to the nodes that produced those inputs (or to leaves' AccumulateGrad).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../core/tensor.h"

namespace weft::autograd {

using TensorList = std::vector<Tensor>;
class Node;

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;  // which of fn's gradient inputs this edge feeds
  bool valid() const { return fn != nullptr; }
};

// What a gradient flowing into a node must look like (one per forward output).
struct GradMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients of the forward outputs -> gradients of the forward inputs (one per next edge;
  // undefined where no gradient flows). Missing output gradients arrive as zeros.
  virtual TensorList apply(TensorList&& grad_outputs) = 0;
  // Drops saved tensors once a backward that does not retain the graph has used the node.
  virtual void release_saved() {}

  const std::string& name() const { return name_; }
  uint64_t sequence_nr() const { return sequence_nr_; }

  std::vector<Edge> next_edges;
  std::vector<GradMeta> output_meta;
  // Hooks on the gradient of one output (Tensor::register_hook on a non-leaf), run before
  // apply; each may replace the gradient.
  std::vector<std::pair<uint32_t, GradHook>> tensor_pre_hooks;
  // Tensors that asked retain_grad(): get the output gradient stored into their .grad.
  std::vector<std::pair<uint32_t, std::weak_ptr<TensorImpl>>> retained;

 protected:
  std::string name_;
  uint64_t sequence_nr_;
};

// A node whose backward is a function object; the saved tensors live in its captures and
// are dropped by release_saved, after which a second backward through it is an error.
class FunctionNode : public Node {
 public:
  using BackwardFn = std::function<TensorList(const TensorList& grad_outputs)>;
  FunctionNode(std::string name, BackwardFn fn) : Node(std::move(name)), fn_(std::move(fn)) {}
  TensorList apply(TensorList&& grad_outputs) override;
  void release_saved() override { fn_ = nullptr; released_ = true; }
  // Each input's storage and its version when the op was recorded: apply refuses to run when
  // one was written in place since (the backward would read the new values).
  std::vector<std::pair<std::weak_ptr<StorageImpl>, uint64_t>> input_versions;
  // The same for the outputs its backward reads (exp's, softmax's, attention's), as PyTorch checks
  // a saved result: record them with reads_outputs.
  std::vector<std::pair<std::weak_ptr<StorageImpl>, uint64_t>> output_versions;
  void reads_outputs(const TensorList& outputs);

 private:
  BackwardFn fn_;
  bool released_ = false;
};

// Sink for a leaf tensor: runs its hooks, accumulates into .grad, then runs its post-accumulate-grad hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  TensorList apply(TensorList&& grad_outputs) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

// Nothing else holds t or its storage and it is contiguous: backward may take it or add into it.
inline bool exclusive(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous();
}
// The edge a gradient for `t` should travel along (invalid if t needs no grad).
Edge gradient_edge(const Tensor& t);
// True when grad mode is on and any of `inputs` requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const TensorList& inputs);
// Records `outputs` as produced by a node with backward `fn` from `inputs`: sets next
// edges, output metadata and each output's grad_fn. Call only when needs_grad(...) holds.
std::shared_ptr<FunctionNode> record(std::string name, const TensorList& inputs,
                                     const TensorList& outputs, FunctionNode::BackwardFn fn);

}  // namespace weft::autograd
