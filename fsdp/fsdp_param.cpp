#include "fsdp/fsdp_param.h"

#include "core/autograd_meta.h"
#include "core/copy.h"
#include "core/device_runtime.h"
#include "core/fill_rule.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"

namespace weft::fsdp {

FSDPParam::FSDPParam(std::string name, std::vector<Tensor*> slots, int64_t shard_dim, int rank, int world,
                     const Tensor& shard_storage, int64_t storage_offset)
    : name_(std::move(name)), slots_(std::move(slots)), shard_dim_(shard_dim), rank_(rank), world_(world),
      offset_(storage_offset) {
  const Tensor& orig = *slots_.at(0);
  global_shape_ = orig.shape();
  requires_grad_ = orig.requires_grad();
  int64_t extent = global_shape_.empty() ? 1 : global_shape_[size_t(shard_dim_)];
  chunk_ = (extent + world_ - 1) / world_;  // torch.chunk
  local_rows_ = std::clamp<int64_t>(extent - int64_t(rank_) * chunk_, 0, chunk_);
  Shape chunk_shape = global_shape_.empty() ? Shape{1} : global_shape_;
  chunk_shape[size_t(shard_dim_)] = chunk_;
  padded_numel_ = shape_numel(chunk_shape);
  padded_flat_ = shard_storage.narrow(0, offset_, padded_numel_);
  Tensor local = chunk_view(padded_flat_).narrow(shard_dim_, 0, local_rows_);
  if (global_shape_.empty() && local_rows_ == 1) local = local.view({});  // 0-dim: held by rank 0
  sharded_ = local.detach();
  if (requires_grad_) sharded_.set_requires_grad(true);
  // Gradients reach the shard through the reduce-scatter only: one from autograd means a forward used the shard
  // itself (a parent reading a separately sharded child's weight, or module->forward() skipping the hooks).
  sharded_.autograd_meta().leaf_hooks.push_back([name = name_](const Tensor&) -> Tensor {
    WEFT_ERROR("fsdp: a backward reached the shard of {}: a forward used this rank's shard of it, outside the call of "
               "the module that holds it (a parent reading a separately sharded child's parameter, or module->forward() "
               "instead of (*module)(x)); call that module, or shard the two in one group", name);
  });
  if (orig.device().is_meta()) init_from_rule(orig);
  else load_full(orig);
}

void FSDPParam::init_from_rule(const Tensor& meta) {
  NoGradGuard no_grad;
  Tensor chunk = chunk_view(padded_flat_);
  auto rule = recorded_fill(meta);
  // A parameter never filled is zeros; shards on the meta device (a memory plan) have no values.
  if (chunk.device().is_meta()) return;
  if (local_rows_ == 0 || !rule) return (void)chunk.zero_();
  zero_padding();  // then only this rank's elements: the slice [rank * chunk, + local_rows) on shard_dim
  fill_slice(chunk.narrow(shard_dim_, 0, local_rows_), *rule, global_shape_, shard_dim_, int64_t(rank_) * chunk_);
}

Tensor FSDPParam::chunk_view(const Tensor& flat, int64_t chunk) const {
  Shape s = global_shape_.empty() ? Shape{1} : global_shape_;
  s[size_t(shard_dim_)] = chunk < 0 ? chunk_ : chunk;
  return flat.view(s);
}

int64_t FSDPParam::padded_numel_for(int ranks) const {
  Shape s = global_shape_.empty() ? Shape{1} : global_shape_;
  s[size_t(shard_dim_)] = (extent() + ranks - 1) / ranks;
  return shape_numel(s);
}

void FSDPParam::copy_chunk_of_unsharded(int index, int ranks, const Tensor& flat) const {
  int64_t chunk = (extent() + ranks - 1) / ranks;
  int64_t start = int64_t(index) * chunk, rows = std::clamp<int64_t>(extent() - start, 0, chunk);
  Tensor dst = chunk_view(flat, chunk);
  dst.zero_();
  if (rows == 0) return;
  Tensor src = global_shape_.empty() ? unsharded_.detach().view({1}) : unsharded_.detach();
  copy_elements(dst.narrow(shard_dim_, 0, rows), src.narrow(shard_dim_, start, rows));
}

void FSDPParam::load_full(const Tensor& full) {
  WEFT_CHECK(full.shape() == global_shape_, "fsdp: parameter {} has global shape {}, got {}", name_,
             shape_str(global_shape_), tensor_desc(full));
  NoGradGuard no_grad;
  Tensor chunk = chunk_view(padded_flat_);
  zero_padding();
  if (local_rows_ == 0) return;
  Tensor src = global_shape_.empty() ? full.view({1}) : full;
  copy_elements(chunk.narrow(shard_dim_, 0, local_rows_),
                src.detach().narrow(shard_dim_, int64_t(rank_) * chunk_, local_rows_));
}

void FSDPParam::copy_out(const Tensor& gathered, DType unsharded_dtype, int64_t column_offset, int ranks) {
  if (!unsharded_.defined() || unsharded_.dtype() != unsharded_dtype) {
    unsharded_ = empty(global_shape_, {.dtype = unsharded_dtype, .device = gathered.device()});
    if (requires_grad_) unsharded_.set_requires_grad(true);
    if (const std::string* by = sharded_.autograd_meta().attached(nn::shard_of))  // Module::to refuses it too
      unsharded_.autograd_meta().attach(nn::shard_of, "the unsharded form of " + *by);
  } else if (!unsharded_.storage()->is_allocated()) {
    unsharded_.storage()->allocate(size_t(unsharded_.numel()) * unsharded_.element_size());
  }
  assemble_into(gathered, column_offset, unsharded_.detach(), ranks);
}

// The pairs (part of `full`, where it lies in `buffer`) of a parameter cut into `ranks` chunks
// of `chunk` rows on shard_dim: rank r's padded chunk is row r of `buffer` [ranks, cols] from
// column `offset`. Sharded on dim 0, the chunks of every full rank are one block of `buffer`
// ([whole, chunk * rest] at its row stride) and of `full`: one copy, not one per rank.
std::vector<std::pair<Tensor, Tensor>> FSDPParam::rank_blocks(const Tensor& full, const Tensor& buffer, int64_t offset,
                                                              int ranks) const {
  const int64_t chunk = (extent() + ranks - 1) / ranks, padded = padded_numel_for(ranks);
  Tensor whole = global_shape_.empty() ? full.view({1}) : full;
  std::vector<std::pair<Tensor, Tensor>> blocks;
  int r = 0;
  if (shard_dim_ == 0 && whole.is_contiguous() && chunk > 0) {
    r = int(std::min<int64_t>(ranks, extent() / chunk));
    if (r > 0) blocks.push_back({whole.narrow(0, 0, r * chunk).view({r, padded}), buffer.narrow(0, 0, r).narrow(1, offset, padded)});
  }
  for (; r < ranks; ++r) {
    const int64_t start = int64_t(r) * chunk, rows = std::clamp<int64_t>(extent() - start, 0, chunk);
    if (rows == 0) break;
    blocks.push_back({whole.narrow(shard_dim_, start, rows),
                      chunk_view(buffer.select(0, r).narrow(0, offset, padded), chunk).narrow(shard_dim_, 0, rows)});
  }
  return blocks;
}

void FSDPParam::assemble_into(const Tensor& gathered, int64_t column_offset, const Tensor& full, int ranks) const {
  for (const auto& [part, chunks] : rank_blocks(full, gathered, column_offset, ranks == 0 ? world_ : ranks))
    copy_elements(part, chunks);
}

void FSDPParam::copy_in_grad(const Tensor& send) {
  Tensor g = unsharded_grad();
  if (!g.defined() || !requires_grad_) return;  // no gradient reached it: contributes zeros
  grad_packed_ = true;
  for (const auto& [part, chunks] : rank_blocks(g.detach(), send, grad_offset_, world_)) copy_elements(chunks, part);
}

void FSDPParam::accumulate_sharded_grad(const Tensor& reduced_flat) {
  if (!requires_grad_ || !std::exchange(grad_packed_, false)) return;
  Tensor part = chunk_view(reduced_flat.narrow(0, grad_offset_, padded_numel_)).narrow(shard_dim_, 0, local_rows_);
  if (global_shape_.empty() && local_rows_ == 1) part = part.view({});
  Tensor current = sharded_.grad();
  if (!current.defined()) {
    // A copy: `part` is a view of the reduce-scatter's buffer, which is released after this.
    Tensor g = part.to(sharded_.dtype()).contiguous();
    const bool pin = pin_grads_ && g.device().is_cpu();
    sharded_.set_grad(pin ? pin_memory(g, pin_device_) : g.clone());
  } else {
    kernels::add_(current, part);
  }
}

void FSDPParam::free_unsharded() {
  if (unsharded_.defined() && unsharded_.storage()->is_allocated()) unsharded_.storage()->free();
}

void FSDPParam::accumulate_unsharded_grad(DType dtype) {
  Tensor g = unsharded_.defined() ? unsharded_.grad() : Tensor();
  if (!g.defined()) return;
  NoGradGuard no_grad;
  if (accumulated_grad_.defined()) kernels::add_(accumulated_grad_, g.to(dtype));
  else accumulated_grad_ = g.to(dtype).contiguous();
  unsharded_.set_grad(Tensor());
}

Tensor FSDPParam::unsharded_grad() const {
  if (accumulated_grad_.defined()) return accumulated_grad_;
  return unsharded_.defined() ? unsharded_.grad() : Tensor();
}

bool FSDPParam::has_unsharded_grad() const { return unsharded_grad().defined(); }

void FSDPParam::clear_unsharded_grad() {
  if (unsharded_.defined()) unsharded_.set_grad(Tensor());
  accumulated_grad_ = Tensor();
}

bool FSDPParam::follow_requires_grad() {  // set on the shard, or on the unsharded parameter while its slots held it
  const bool now = sharded_.requires_grad() != requires_grad_ ? sharded_.requires_grad() : slots_[0]->requires_grad();
  if (now == requires_grad_) return false;
  sharded_.set_requires_grad(requires_grad_ = now);
  if (unsharded_.defined()) unsharded_.set_requires_grad(now);
  return true;
}

void FSDPParam::use_sharded() {
  for (Tensor* s : slots_) *s = sharded_;
}

void FSDPParam::use_unsharded() {
  for (Tensor* s : slots_) *s = unsharded_;
}

}  // namespace weft::fsdp
