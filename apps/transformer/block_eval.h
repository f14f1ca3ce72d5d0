// apps/transformer: a model's loss over a whole token stream (weft-transformer eval), cut as
// transformers' language-modelling examples group text: consecutive blocks of ctx + 1 tokens,
// each block predicting its last ctx tokens from the ones before them; the tail shorter than a
// block is left out (or, for a dataset of examples, example by example). The loss is the mean over every predicted token, the perplexity exp(loss).
#pragma once
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <string>

#include "apps/common/nonfinite.h"
#include "apps/transformer/example_data.h"
#include "apps/transformer/text_data.h"
#include "weft.h"

namespace weft::apps {

struct BlockLoss {
  double loss_sum = 0;  // natural-log cross-entropy summed over the predicted tokens
  int64_t tokens = 0;   // predicted tokens
  int64_t blocks = 0;
  double loss() const { return tokens > 0 ? loss_sum / double(tokens) : 0; }
};

// exp(loss) as printed: `decimals` places, or in e-notation past 1e9 (a diverged run's had printed 135 digits).
inline std::string perplexity_text(double loss, int decimals) {
  const double p = unsigned_nan(std::exp(loss));
  return p < 1e9 ? fmt::format("{:.{}f}", p, decimals) : fmt::format("{:.{}e}", p, decimals);
}

// Blocks [first, first + count) of `stream` (block b: tokens [b (ctx + 1), (b + 1) (ctx + 1))),
// `batch` blocks per forward, on `device`; `model` in evaluation mode, without gradients.
BlockLoss block_loss(nn::Module& model, TokenView stream, int64_t ctx, int64_t first, int64_t count, int64_t batch,
                     Device device = kCPU);

// Over a dataset of examples instead (example_data.h): every example of `set` in order, `batch` per forward, the
// loss the mean over the targets that carry loss (`tokens` counts them, `blocks` the examples).
BlockLoss example_loss(nn::Module& model, const ExampleSet& set, int64_t batch, Device device = kCPU);

// How many whole blocks of ctx + 1 tokens `stream` holds.
inline int64_t block_count(TokenView stream, int64_t ctx) { return stream.size() / (ctx + 1); }

}  // namespace weft::apps
