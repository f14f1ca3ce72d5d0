// apps: --deterministic. Each optimizer step's global batch is split into V virtual micro-batches (--virtual-batches,
// default 8), rows [m B / V, (m + 1) B / V) of every accumulated batch; rank r of W runs micro-batches [r V / W, (r +
// 1) V / W), each as its own forward and backward (a leaf), so that every micro-batch is computed with the same shapes
// wherever it runs. The leaves' gradients add along one fixed tree (nn/tree_sum.h: fsdp's ordered reduction across
// ranks, or nn::add_grads_as_leaf in one process), their losses and the validation losses add in one fixed order, and
// each leaf's dropout draws from a generator keyed by (seed, step, leaf): the same bits at every world size W dividing
// V.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "apps/common/ranks.h"
#include "core/generator.h"
#include "fsdp/fsdp.h"
#include "nn/tree_sum.h"

namespace weft::apps {

struct LeafPlan {
  int64_t virtual_batches = 8;  // V
  int64_t accum = 1;            // A: accumulated batches per step
  int64_t per_rank = 8;         // V / W micro-batches on this rank
  int rank = 0;
  int64_t leaves() const { return per_rank * accum; }  // backwards per rank per step
  // Leaf j (0 <= j < leaves()) of this rank: micro-batch rank * per_rank + j / accum of
  // accumulated batch j % accum. Its index in the step's tree: rank * leaves() + j.
  int64_t micro(int64_t j) const { return rank * per_rank + j / accum; }
  int64_t accumulated(int64_t j) const { return j % accum; }
  int64_t tree_index(int64_t j) const { return rank * leaves() + j; }
  // Rows [first, last) of a global batch of `rows` that micro-batch m holds.
  std::pair<int64_t, int64_t> rows(int64_t m, int64_t batch_rows) const {
    return {batch_rows * m / virtual_batches, batch_rows * (m + 1) / virtual_batches};
  }
};

// Checks the split (V divides the batch, W divides V, V / W and A powers of two: each rank's
// leaves then form one node of the tree) for rank `rank` of `world` and names what does not fit.
LeafPlan make_leaf_plan(const std::string& program, int64_t virtual_batches, int64_t batch_size, int64_t accum,
                        int world, int rank);

// One step's leaves on this rank, in order: `backward(j, lo, hi)` runs leaf j's forward and
// backward on rows [lo, hi) of the global batch of `batch_size`. Under FSDP (`root`) the gradients
// are reduced along the tree after the last leaf; without it they are summed along `tree` into
// `params`' .grad. The training loop's step and the memory plan's run this same sequence.
void run_leaves(const LeafPlan& plan, int64_t batch_size, fsdp::FSDPModule* root, nn::TreeSum& tree,
                const std::vector<Tensor>& params, const std::function<void(int64_t, int64_t, int64_t)>& backward);

// While alive, the default generator draws from a stream of its own for leaf `tree_index` of
// step `step` (its seed: a Philox draw of the run's seed at that pair); the previous state after.
class LeafRandom {
 public:
  LeafRandom(int64_t step, int64_t tree_index, int64_t leaves_per_step);
  ~LeafRandom();
  LeafRandom(const LeafRandom&) = delete;
  LeafRandom& operator=(const LeafRandom&) = delete;

 private:
  Generator::State saved_;
};

// The sum of every rank's values in one order at any world size: each rank holds `groups`
// runs of equally many values (run g: its micro-batches of batch g, in order); the sum goes
// batch by batch, rank by rank, value by value. The same on every rank.
double ordered_sum(const std::vector<double>& local, int64_t groups, const Ranks& ranks);
// ordered_sum over the number of values of all ranks.
double ordered_mean(const std::vector<double>& local, int64_t groups, const Ranks& ranks);

}  // namespace weft::apps
