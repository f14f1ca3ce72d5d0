#include "fsdp/param_group.h"

#include "core/copy.h"
#include "core/grad_mode.h"
#include "core/trace.h"
#include "kernels/elementwise.h"

namespace weft::fsdp {

FSDPParamGroup::FSDPParamGroup(std::vector<Entry> entries, const FullyShardOptions& opts,
                               dist::ProcessGroupPtr shard_group, dist::ProcessGroupPtr replicate_group)
    : shard_group_(std::move(shard_group)), replicate_group_(std::move(replicate_group)) {
  WEFT_CHECK(!entries.empty(), "fsdp: a parameter group needs at least one parameter");
  const int world = shard_group_->size(), rank = shard_group_->rank();
  DType dtype = entries[0].slots[0]->dtype();
  Device device = entries[0].slots[0]->device();
  // Padded chunk sizes first, to size the flat shard buffer.
  std::vector<int64_t> padded;
  for (auto& e : entries) {
    const Tensor& t = *e.slots[0];
    WEFT_CHECK(t.dtype() == dtype && t.device() == device,
               "fully_shard: parameters of one group must share dtype and device: {} is {} but {} is {}", e.name,
               tensor_desc(t), entries[0].name, tensor_desc(*entries[0].slots[0]));
    WEFT_CHECK(is_floating(dtype), "fully_shard: parameter {} is {}; only floating parameters can be sharded", e.name,
               tensor_desc(t));
    Shape s = t.dim() == 0 ? Shape{1} : t.shape();
    int64_t extent = s[size_t(e.shard_dim)];
    int64_t chunk = (extent + world - 1) / world;
    if (e.shard_dim != 0)
      WEFT_CHECK(extent % world == 0,
                 "fully_shard: parameter {} of shape {} is sharded on dim {} of size {}, which {} ranks do not "
                 "divide evenly (only dim 0 may be padded)", e.name, shape_str(t.shape()), e.shard_dim, extent, world);
    s[size_t(e.shard_dim)] = chunk;
    padded.push_back(shape_numel(s));
    group_numel_ += padded.back();
  }
  flat_shard_ = zeros({group_numel_}, {.dtype = dtype, .device = device});
  int64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    params_.push_back(std::make_unique<FSDPParam>(entries[i].name, entries[i].slots, entries[i].shard_dim, rank,
                                                  world, flat_shard_, offset));
    offset += padded[i];
  }
  label = params_[0]->name();
  param_dtype_ = opts.mp_policy.param_dtype.value_or(dtype);
  reduce_dtype_ = opts.mp_policy.reduce_dtype.value_or(param_dtype_);
  for (auto& p : params_) p->use_sharded();
}

void FSDPParamGroup::start_unshard() {
  if (state_ != State::sharded && state_ != State::partial) return;
  gather_started_us_ = trace::enabled() ? trace::now_us() : 0;
  if (state_ == State::partial) {
    // Gather within the subgroup from the chunks kept after forward.
    gather_send_ = partial_shard_;
    gather_recv_ = empty({int64_t(partial_group_->size()), partial_shard_.numel()},
                         {.dtype = partial_shard_.dtype(), .device = partial_shard_.device()});
    gather_work_ = partial_group_->all_gather_into_tensor(gather_recv_.view({-1}), gather_send_);
    gathering_partial_ = true;
  } else {
    const int world = shard_group_->size();
    // The shard buffer is sent as is unless parameters are gathered in another dtype.
    gather_send_ = param_dtype_ == flat_shard_.dtype() ? flat_shard_ : flat_shard_.to(param_dtype_);
    gather_recv_ = empty({int64_t(world), group_numel_}, {.dtype = param_dtype_, .device = flat_shard_.device()});
    gather_work_ = shard_group_->all_gather_into_tensor(gather_recv_.view({-1}), gather_send_);
    gathering_partial_ = false;
  }
  ++stats.all_gathers;
  state_ = State::gathering;
}

void FSDPParamGroup::finish_unshard() {
  if (state_ == State::unsharded) return;
  if (state_ == State::sharded || state_ == State::partial) start_unshard();
  {
    trace::Span span("wait all_gather", "fsdp");
    gather_work_->wait();
  }
  if (gather_started_us_)
    trace::record("all_gather " + label, "comm", gather_started_us_, trace::now_us() - gather_started_us_, 1);
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (gathering_partial_)
        params_[i]->copy_out(gather_recv_, param_dtype_, partial_offsets_[i], partial_group_->size());
      else
        params_[i]->copy_out(gather_recv_, param_dtype_, params_[i]->storage_offset());
    }
  }
  gather_work_.reset();
  gather_send_ = Tensor();
  gather_recv_ = Tensor();
  partial_shard_ = Tensor();
  for (auto& p : params_) p->use_unsharded();
  state_ = State::unsharded;
}

void FSDPParamGroup::reshard() {
  if (state_ == State::gathering) finish_unshard();  // a started collective must complete
  for (auto& p : params_) {
    p->free_unsharded();
    p->use_sharded();
  }
  partial_shard_ = Tensor();
  state_ = State::sharded;
}

void FSDPParamGroup::reshard_to_subgroup(const dist::ProcessGroupPtr& group) {
  if (state_ == State::gathering) finish_unshard();
  if (state_ != State::unsharded) return;
  const int k = group->size(), index = group->rank();
  partial_group_ = group;
  partial_offsets_.clear();
  int64_t total = 0;
  for (auto& p : params_) {
    partial_offsets_.push_back(total);
    total += p->padded_numel_for(k);
  }
  Tensor kept = empty({total}, {.dtype = param_dtype_, .device = flat_shard_.device()});
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i]->copy_chunk_of_unsharded(index, k, kept.narrow(0, partial_offsets_[i], params_[i]->padded_numel_for(k)));
  }
  reshard();
  partial_shard_ = kept;
  state_ = State::partial;
}

bool FSDPParamGroup::has_unsharded_grads() const {
  for (auto& p : params_)
    if (p->has_unsharded_grad()) return true;
  return false;
}

void FSDPParamGroup::start_reduce_scatter() {
  if (pending_rs_) finish_reduce_scatter();
  const int world = shard_group_->size();
  NoGradGuard no_grad;
  auto pr = std::make_unique<PendingReduce>();
  pr->send = zeros({int64_t(world), group_numel_}, {.dtype = reduce_dtype_, .device = flat_shard_.device()});
  for (auto& p : params_) {
    p->copy_in_grad(pr->send);
    p->clear_unsharded_grad();
  }
  pr->out = empty({group_numel_}, {.dtype = reduce_dtype_, .device = flat_shard_.device()});
  bool average = reduce_scatter_divide_factor == 0;
  rs_started_us_ = trace::enabled() ? trace::now_us() : 0;
  pr->work = shard_group_->reduce_scatter_tensor(pr->out, pr->send.view({-1}),
                                                 average ? dist::ReduceOp::avg : dist::ReduceOp::sum);
  ++stats.reduce_scatters;
  pending_rs_ = std::move(pr);
}

void FSDPParamGroup::finish_reduce_scatter() {
  if (!pending_rs_) return;
  auto pr = std::move(pending_rs_);
  {
    trace::Span span("wait reduce_scatter", "fsdp");
    pr->work->wait();
  }
  if (rs_started_us_)
    trace::record("reduce_scatter " + label, "comm", rs_started_us_, trace::now_us() - rs_started_us_, 1);
  NoGradGuard no_grad;
  if (replicate_group_ && replicate_group_->size() > 1 && requires_all_reduce) {
    bool average = reduce_scatter_divide_factor == 0;
    replicate_group_->all_reduce(pr->out, average ? dist::ReduceOp::avg : dist::ReduceOp::sum)->wait();
    ++stats.all_reduces;
  }
  if (reduce_scatter_divide_factor != 0) kernels::mul_scalar_(pr->out, 1.0 / reduce_scatter_divide_factor);
  for (auto& p : params_) p->accumulate_sharded_grad(pr->out);
}

}  // namespace weft::fsdp
