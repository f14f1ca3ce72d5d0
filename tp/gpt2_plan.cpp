#include "tp/gpt2_plan.h"

#include "core/error.h"
#include "dist/agree.h"
#include "nn/transformer.h"
#include "tp/parallel_style.h"

namespace weft::tp {

void parallelize_gpt2_blocks(nn::Module& root, const dist::ProcessGroupPtr& group) {
  WEFT_CHECK(group != nullptr, "tp: parallelize_gpt2_blocks: no process group");
  ParallelPlan plan;
  std::vector<nn::Block*> blocks;
  dist::agree({group->device().is_meta() ? nullptr : group}, "tp: parallelize_gpt2_blocks", [&] {  // every rank stops
    for (const auto& [path, m] : root.named_modules()) {
      auto* block = dynamic_cast<nn::Block*>(m.get());
      if (!block) continue;
      WEFT_CHECK(block->attn->n_head % group->size() == 0, "tp: parallelize_gpt2_blocks: {}'s n_head {} does not "
                 "divide over {} ranks", path, block->attn->n_head, group->size());
      const std::string at = path.empty() ? "" : path + ".";
      plan.insert(plan.end(), {{at + "attn", {.input = Comm::copy}},
                               {at + "attn.c_attn", {.weights = Weights::colwise, .chunks = 3}},
                               {at + "attn.c_proj", {Weights::rowwise, Comm::none, Comm::reduce}},
                               {at + "mlp", {.input = Comm::copy}},
                               {at + "mlp.c_fc", {Weights::colwise}},
                               {at + "mlp.c_proj", {Weights::rowwise, Comm::none, Comm::reduce}}});
      blocks.push_back(block);
    }
    WEFT_CHECK(!blocks.empty(), "tp: parallelize_gpt2_blocks: {} holds no GPT-2 block (nn::Block)", root.type_name());
  });
  parallelize_module(root, group, plan);
  for (nn::Block* b : blocks)  // each attention: this rank's heads (its probabilities' dropout too)
    b->attn->n_head /= group->size(), b->attn->dropout_block = {1, group->size(), group->rank()};
}

}  // namespace weft::tp
