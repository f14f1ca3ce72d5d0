#include "apps/common/deterministic.h"

#include "core/error.h"
#include "core/tensor.h"

namespace weft::apps {

LeafPlan make_leaf_plan(const std::string& program, int64_t virtual_batches, int64_t batch_size, int64_t accum,
                        int world, int rank) {
  auto power_of_two = [](int64_t n) { return n > 0 && (n & (n - 1)) == 0; };
  WEFT_CHECK(virtual_batches > 0 && batch_size % virtual_batches == 0,
             "{}: --deterministic: --virtual-batches {} must divide --batch-size {}", program, virtual_batches,
             batch_size);
  WEFT_CHECK(virtual_batches % world == 0 && power_of_two(virtual_batches / world),
             "{}: --deterministic: {} rank{} must divide --virtual-batches {} into a power of two per rank (1, 2, 4, "
             "...), so that each rank's micro-batches are one node of the summation tree", program, world, world == 1 ? "" : "s",
             virtual_batches);
  WEFT_CHECK(power_of_two(accum), "{}: --deterministic: --grad-accum {} must be a power of two (each rank's "
             "backwards per step are one node of the summation tree)", program, accum);
  return {.virtual_batches = virtual_batches, .accum = accum, .per_rank = virtual_batches / world, .rank = rank};
}

void run_leaves(const LeafPlan& plan, int64_t batch_size, fsdp::FSDPModule* root, nn::TreeSum& tree,
                const std::vector<Tensor>& params, const std::function<void(int64_t, int64_t, int64_t)>& backward) {
  const int64_t n = plan.leaves();
  for (int64_t j = 0; j < n; ++j) {
    if (root) root->set_requires_gradient_sync(j + 1 == n);
    auto [lo, hi] = plan.rows(plan.micro(j), batch_size);
    backward(j, lo, hi);
    if (!root) nn::add_grads_as_leaf(tree, params);
  }
  if (!root) nn::set_grads_to_total(tree, params);
}

LeafRandom::LeafRandom(int64_t step, int64_t tree_index, int64_t leaves_per_step)
    : saved_(default_generator().state()) {
  const uint64_t leaf = uint64_t(step) * uint64_t(leaves_per_step) + uint64_t(tree_index);
  const auto w = philox4x32(saved_.seed ^ 0x6c656166ull, leaf);  // "leaf": apart from other uses of the seed
  default_generator().set_state({(uint64_t(w[1]) << 32) | w[0], 0});
}

LeafRandom::~LeafRandom() { default_generator().set_state(saved_); }

double ordered_sum(const std::vector<double>& local, int64_t groups, const Ranks& ranks) {
  std::vector<double> all = local;
  if (ranks.fsdp && ranks.world > 1) {
    const int64_t n = int64_t(local.size());
    Tensor mine = from_vector(local, {n}, {.dtype = kFloat64});
    Tensor gathered = empty({ranks.world * n}, {.dtype = kFloat64});
    dist::world()->all_gather_into_tensor(gathered, mine)->wait();
    all = to_vector(gathered);
  }
  const int64_t per = int64_t(local.size()) / groups;
  double sum = 0;
  for (int64_t g = 0; g < groups; ++g)
    for (int r = 0; r < (ranks.fsdp ? ranks.world : 1); ++r)
      for (int64_t i = 0; i < per; ++i) sum += all[size_t(int64_t(r) * int64_t(local.size()) + g * per + i)];
  return sum;
}

double ordered_mean(const std::vector<double>& local, int64_t groups, const Ranks& ranks) {
  return ordered_sum(local, groups, ranks) / double(local.size() * size_t(ranks.fsdp ? ranks.world : 1));
}

}  // namespace weft::apps
