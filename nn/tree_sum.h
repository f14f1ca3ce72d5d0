// nn: sums in a fixed tree, so that a total does not depend on how its terms were split between processes. Terms
// (leaves) arrive in order; the tree pairs neighbours level by level, ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + ...), an
// odd node out joining the level above as the right operand. A process holding the 2^k leaves [j 2^k, (j + 1) 2^k) sums
// them into exactly the node the whole tree has there; another TreeSum over those nodes, in process order, finishes the
// tree as one process would: the same bits at 1, 2, 4 or 8 processes. With n leaves added it holds at most log2(n) + 1
// partial sums at once.
//
//   nn::TreeSum tree;
//   for (each micro-batch) { loss.backward(); nn::add_grads_as_leaf(tree, params); }
//   nn::set_grads_to_total(tree, params);  // .grad: the tree's sum of the micro-batches'
#pragma once
#include <vector>

#include "../core/tensor.h"

namespace weft::nn {

class TreeSum {
 public:
  // The next leaf: tensors of the same shapes as every other leaf's, taken over (the sums are made in place in them).
  void add(std::vector<Tensor> leaf);
  int64_t leaves() const { return leaves_; }
  // The sum of the leaves added since the last total() (none: empty), and a fresh start.
  std::vector<Tensor> total();

 private:
  struct Node {
    int level;
    std::vector<Tensor> sum;
  };
  static void merge(Node& left, const Node& right);
  std::vector<Node> stack_;
  int64_t leaves_ = 0;
};

// The parameters' gradients as the tree's next leaf (zeros for a parameter none reached);
// their .grad is cleared, so the next backward starts from none.
void add_grads_as_leaf(TreeSum& tree, const std::vector<Tensor>& params);
// Sets each parameter's .grad to the tree's total of its leaves.
void set_grads_to_total(TreeSum& tree, const std::vector<Tensor>& params);

}  // namespace weft::nn
