// Models, batches and helpers shared by the tensor-parallel suites (inline: the suites are
// linked into one program). The world is one tensor-parallel group.
#pragma once
#include <memory>
#include <vector>

#include "dist/dist.h"
#include "fsdp_test_models.h"
#include "tp/tp.h"
#include "weft.h"

namespace weft::tp_test {

inline dist::ProcessGroupPtr group() { return dist::world(); }
inline int P() { return dist::world_size(); }
inline int R() { return dist::rank(); }

inline std::vector<double> values(const Tensor& t) { return to_vector(t.contiguous()); }

inline nn::LlamaConfig small_llama() {
  // Heads and key/value heads divide over 1, 2 and 4 ranks; grouped (2 query heads a key/value head).
  return {.vocab_size = 32, .ctx = 12, .n_layer = 2, .n_head = 8, .n_kv_head = 4, .d_model = 32, .ffn_dim = 48};
}

template <class Model>
std::shared_ptr<Model> seeded_llama(const nn::LlamaConfig& cfg, uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<Model>(cfg);
  nn::init_llama(*m);
  return m;
}

inline fsdp_test::Batch token_batch(int step) {
  Generator g(300 + uint64_t(step));
  return {(rand({4, 12}, {}, &g) * 32.0).to(kInt64), (rand({4, 12}, {}, &g) * 32.0).to(kInt64)};
}

// The loss of a model whose logits are this rank's vocabulary columns.
inline Tensor parallel_loss_of(nn::Module& m, const fsdp_test::Batch& b, const dist::ProcessGroupPtr& g = group()) {
  Tensor logits = m(b.x);
  return tp::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), b.y.reshape({-1}), g);
}

}  // namespace weft::tp_test
