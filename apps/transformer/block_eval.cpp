#include "apps/transformer/block_eval.h"

#include <algorithm>

namespace weft::apps {

BlockLoss block_loss(nn::Module& model, TokenView stream, int64_t ctx, int64_t first, int64_t count, int64_t batch,
                     Device device) {
  WEFT_CHECK(ctx >= 1 && batch >= 1 && first >= 0 && count >= 0 && first + count <= block_count(stream, ctx),
             "block_loss: blocks [{}, {}) of ctx {} are not within the {} whole blocks of a stream of {} tokens", first,
             first + count, ctx, block_count(stream, ctx), stream.size());
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  BlockLoss r;
  for (int64_t b = first; b < first + count; b += batch) {
    const int64_t rows = std::min(batch, first + count - b);
    Tensor x = empty({rows, ctx}, {.dtype = kInt64}), y = empty({rows, ctx}, {.dtype = kInt64});
    int64_t* px = x.data<int64_t>();
    int64_t* py = y.data<int64_t>();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t t = 0; t < ctx; ++t) {
        const int64_t at = (b + i) * (ctx + 1) + t;
        px[i * ctx + t] = stream[at], py[i * ctx + t] = stream[at + 1];
      }
    Tensor logits = model(x.to(device));
    r.loss_sum += cross_entropy(logits.reshape({rows * ctx, logits.size(-1)}), y.to(device).view({-1}),
                                {.reduction = "sum"}).to(kFloat64).item();
    r.tokens += rows * ctx, r.blocks += rows;
  }
  model.train(was_training);
  return r;
}

BlockLoss example_loss(nn::Module& model, const ExampleSet& set, int64_t batch, Device device) {
  WEFT_CHECK(batch >= 1, "example_loss: batch {} must be positive", batch);
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  BlockLoss r;
  for (int64_t b = 0; b < set.size(); b += batch) {
    std::vector<int64_t> picked(size_t(std::min(batch, set.size() - b)));
    for (size_t i = 0; i < picked.size(); ++i) picked[i] = b + int64_t(i);
    auto [x, y, positions] = set.rows(picked, 0, int64_t(picked.size()));
    Tensor logits = positions.defined() ? model({x.to(device), positions.to(device)})[0] : model(x.to(device));
    r.loss_sum += cross_entropy(logits.reshape({y.numel(), logits.size(-1)}), y.to(device).view({-1}),
                                {.reduction = "sum"}).to(kFloat64).item();
    r.tokens += set.targets(picked), r.blocks += int64_t(picked.size());
  }
  model.train(was_training);
  return r;
}

}  // namespace weft::apps
