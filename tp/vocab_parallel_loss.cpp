#include "tp/vocab_parallel_loss.h"

#include "core/error.h"
#include "tp/collectives.h"

namespace weft::tp {

VocabRows vocab_rows_of(const Tensor& ids, int64_t first, int64_t n) {
  const Tensor t = ids.to(kFloat32);  // exact for vocabularies under 2^24 ids
  const Tensor hit = (t > double(first) - 0.5).to(kFloat32) * (t < double(first + n) - 0.5).to(kFloat32);
  return {hit, (clamp(t - double(first), 0.0, double(n - 1)) * hit).to(kInt64)};
}

int64_t first_id_outside(const Tensor& ids, int64_t total, const Tensor& counted) {
  if (ids.numel() == 0) return -1;
  Tensor outside = 1.0 - vocab_rows_of(ids, 0, total).hit;
  if (counted.defined()) outside = outside * counted;
  const auto [most, at] = max(outside.reshape({-1}), 0);
  if (ids.device().is_meta()) return -1;  // a memory plan's step: the same buffers, no values to check
  return most.item() > 0 ? int64_t(at.item()) : -1;
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, const dist::ProcessGroupPtr& group,
                                    const CrossEntropyOptions& opts) {
  WEFT_CHECK(group != nullptr, "tp::vocab_parallel_cross_entropy: no process group");
  WEFT_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0) && target.dtype() == kInt64,
             "tp::vocab_parallel_cross_entropy: expected logits [N, V/P] and i64 targets [N], got {} and {}",
             tensor_desc(logits), tensor_desc(target));
  WEFT_CHECK(opts.label_smoothing == 0.0, "tp::vocab_parallel_cross_entropy: label_smoothing {} is not supported",
             opts.label_smoothing);
  WEFT_CHECK(opts.reduction == "mean" || opts.reduction == "sum" || opts.reduction == "none",
             "tp::vocab_parallel_cross_entropy: unknown reduction '{}'", opts.reduction);
  const int64_t n = logits.size(1), first = int64_t(group->rank()) * n;
  const Tensor kept = 1.0 - (target.to(kFloat32) == double(opts.ignore_index)).to(kFloat32);
  if (const int64_t r = first_id_outside(target, n * group->size(), kept); r >= 0)
    WEFT_CHECK(false, "tp::vocab_parallel_cross_entropy: target {} (row {}) is out of range for {} classes (ignore_index {})",
               int64_t(target[r].item()), r, n * group->size(), opts.ignore_index);
  const Tensor z = logits.dtype() == kFloat32 ? logits : logits.to(kFloat32);
  // The shift by the row's maximum only keeps exp() in range: no gradient flows through it.
  Tensor top = max(z.detach(), 1, true).first.contiguous();
  if (dist::WorkPtr w = group->all_reduce(top, dist::ReduceOp::max); !w->wait_on_current_stream()) w->wait();
  const Tensor shifted = z - top;
  const Tensor total = reduce_from_parallel(sum(exp(shifted), {1}), group);
  // The target's logit, from the rank whose columns hold it (0 from the others).
  const auto [mine, column] = vocab_rows_of(target, first, n);
  const Tensor picked = reduce_from_parallel(gather(shifted, 1, column.unsqueeze(1)).reshape({-1}) * mine, group);
  const Tensor per_row = (log(total) - picked) * kept;
  if (opts.reduction == "none") return per_row;
  if (opts.reduction == "sum") return sum(per_row);
  return sum(per_row) / sum(kept);
}

}  // namespace weft::tp
