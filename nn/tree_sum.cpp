#include "nn/tree_sum.h"

#include "core/error.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"

namespace weft::nn {

void TreeSum::merge(Node& left, const Node& right) {
  WEFT_CHECK(left.sum.size() == right.sum.size(), "TreeSum: a leaf of {} tensors after leaves of {}", right.sum.size(),
             left.sum.size());
  NoGradGuard no_grad;
  for (size_t i = 0; i < left.sum.size(); ++i) kernels::add_(left.sum[i], right.sum[i]);
  ++left.level;
}

void TreeSum::add(std::vector<Tensor> leaf) {
  stack_.push_back({0, std::move(leaf)});
  ++leaves_;
  while (stack_.size() >= 2 && stack_.back().level == stack_[stack_.size() - 2].level) {
    merge(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
}

std::vector<Tensor> TreeSum::total() {
  // What is left are complete subtrees of falling size: the smaller ones join from the right.
  while (stack_.size() >= 2) {
    merge(stack_[stack_.size() - 2], stack_.back());
    stack_.pop_back();
  }
  std::vector<Tensor> out = stack_.empty() ? std::vector<Tensor>{} : std::move(stack_.back().sum);
  stack_.clear();
  leaves_ = 0;
  return out;
}

void add_grads_as_leaf(TreeSum& tree, const std::vector<Tensor>& params) {
  std::vector<Tensor> leaf;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    leaf.push_back(g.defined() ? g : zeros(p.shape(), {.dtype = p.dtype(), .device = p.device()}));
    p.set_grad(Tensor());
  }
  tree.add(std::move(leaf));
}

void set_grads_to_total(TreeSum& tree, const std::vector<Tensor>& params) {
  std::vector<Tensor> sum = tree.total();
  WEFT_CHECK(sum.size() == params.size(), "set_grads_to_total: the tree holds {} gradients for {} parameters",
             sum.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) params[i].set_grad(sum[i]);
}

}  // namespace weft::nn
