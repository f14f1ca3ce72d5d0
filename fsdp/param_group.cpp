#include "fsdp/param_group.h"

#include "core/allocator.h"
#include "core/device_runtime.h"
#include "core/grad_mode.h"
#include "core/stream.h"
#include "dist/agree.h"
#include "fsdp/collectives.h"
#include "fsdp/comm_context.h"

namespace weft::fsdp {

FSDPParamGroup::~FSDPParamGroup() = default;

FSDPParamGroup::FSDPParamGroup(std::vector<Entry> entries, const FullyShardOptions& opts,
                               dist::ProcessGroupPtr shard_group, dist::ProcessGroupPtr replicate_group)
    : shard_group_(std::move(shard_group)), replicate_group_(std::move(replicate_group)),
      comm_(std::make_shared<CommContext>()) {
  WEFT_CHECK(!entries.empty(), "fsdp: a parameter group needs at least one parameter");
  const int world = shard_group_->size(), rank = shard_group_->rank();
  DType dtype = entries[0].slots[0]->dtype();
  // Meta (deferred) parameters get their shards on the others' device, or the shard group's.
  Device device = shard_group_->device();
  for (auto& e : entries)
    if (!e.slots[0]->device().is_meta()) {
      device = e.slots[0]->device();
      break;
    }
  // Padded chunk sizes first, to size the flat shard buffer.
  std::vector<int64_t> padded;
  for (auto& e : entries) {
    const Tensor& t = *e.slots[0];
    WEFT_CHECK(t.dtype() == dtype && (t.device() == device || t.device().is_meta()),
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
  compute_device_ = device;
  // CPU offload only means something for device parameters: CPU ones are already on the host.
  offload_ = opts.offload_policy.has_value() && !runs_on_host(device);
  // Uninitialised: each FSDPParam writes its own padded chunk, which together cover it. Offloaded
  // shards are pinned, so that the all-gather's upload and the gradients' download are asynchronous.
  flat_shard_ = !offload_                          ? empty({group_numel_}, {.dtype = dtype, .device = device})
                : opts.offload_policy->pin_memory ? empty_pinned({group_numel_}, dtype, device)
                                                  : empty({group_numel_}, {.dtype = dtype});
  int64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    params_.push_back(std::make_unique<FSDPParam>(entries[i].name, entries[i].slots, entries[i].shard_dim, rank,
                                                  world, flat_shard_, offset));
    offset += padded[i];
    if (offload_) params_.back()->set_pin_grads(opts.offload_policy->pin_memory, device);
  }
  lay_out_grads();
  // The shards were copied from the device into pinned memory asynchronously; the host (an
  // optimizer, a state dict) may read them as soon as fully_shard returns.
  if (offload_) current_stream(device).synchronize();
  label = params_[0]->name();
  if (MemoryOwner::wanted() && group_numel_ > 0)
    allocator_for(flat_shard_.device()).label(flat_shard_.storage()->data_or_null(), "fsdp shards of the group of '" + label + "'");
  param_dtype_ = opts.mp_policy.param_dtype.value_or(dtype);
  reduce_dtype_ = opts.mp_policy.reduce_dtype.value_or(param_dtype_);
  for (auto& p : params_) p->use_sharded();
}

void FSDPParamGroup::lay_out_grads() {
  WEFT_CHECK(!pending_rs_ && !partial_reduce_output_.defined() && grad_leaves_.leaves() == 0, "fsdp: requires_grad of "
             "a parameter of '{}' changed while its gradients wait for a reduction (HSDP without all-reduce, or "
             "deterministic accumulation): change it after the step that reduces them", label);
  grad_numel_ = 0;
  for (auto& p : params_)
    p->set_grad_offset(p->requires_grad() ? std::exchange(grad_numel_, grad_numel_ + p->padded_numel()) : -1);
}

void FSDPParamGroup::follow_requires_grad() {
  bool changed = false;
  for (auto& p : params_) changed |= p->follow_requires_grad();
  if (changed) lay_out_grads();
}

void FSDPParamGroup::set_comm_context(std::shared_ptr<CommContext> ctx) { comm_ = std::move(ctx); }

void FSDPParamGroup::start_unshard() {
  if (state_ != State::sharded && state_ != State::partial) return;
  const std::string owner = "fsdp all-gather of '" + label + "'";
  MemoryOwner owning(owner);
  if (state_ == State::partial) {
    // Gather within the subgroup from the chunks kept after forward.
    gather_ = std::make_unique<AllGatherResult>(all_gather(*comm_, partial_shard_, partial_shard_.dtype(),
                                                           partial_shard_.device(), partial_group_, label));
    gathering_partial_ = true;
  } else {
    // The shard buffer is sent as is unless parameters are gathered in another dtype or it is
    // offloaded (then uploaded first: from pinned memory, asynchronously).
    gather_ = std::make_unique<AllGatherResult>(
        all_gather(*comm_, flat_shard_, param_dtype_, compute_device_, shard_group_, label));
    gathering_partial_ = false;
  }
  ++stats.all_gathers;
  state_ = State::gathering;
}

void FSDPParamGroup::finish_unshard() {
  if (state_ == State::unsharded) return;
  if (state_ == State::sharded || state_ == State::partial) start_unshard();
  const std::string owner = "fsdp unsharded parameters of '" + label + "'";
  MemoryOwner owning(owner);
  // Dropped only once done: a wait that throws leaves the collective to complete later, unless every rank skipped it
  // (the collective check's verdict): it never completes, so the group is sharded again and the error goes on.
  AllGatherResult& gathered = *gather_;
  try {
    wait_all_gather(gathered);
  } catch (const dist::AgreedError&) {
    gather_.reset();
    partial_shard_ = Tensor();
    for (auto& p : params_) p->free_unsharded(), p->use_sharded();
    state_ = State::sharded;
    throw;
  }
  std::vector<int64_t> offsets = partial_offsets_;
  if (!gathering_partial_) {
    offsets.clear();
    for (auto& p : params_) offsets.push_back(p->storage_offset());
  }
  all_gather_copy_out(*comm_, std::move(gathered), params_, param_dtype_, offsets);
  gather_.reset();
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
  const std::string owner = "fsdp kept chunk (reshard_after_forward = k) of '" + label + "'";
  MemoryOwner owning(owner);
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

void FSDPParamGroup::accumulate_unsharded_grads() {
  if (reduce_dtype_ == param_dtype_) return;
  for (auto& p : params_) p->accumulate_unsharded_grad(reduce_dtype_);
}

bool FSDPParamGroup::has_unsharded_grads() const {
  for (auto& p : params_)
    if (p->has_unsharded_grad()) return true;
  return false;
}

void FSDPParamGroup::add_grad_leaf() {
  if (grad_numel_ == 0) return;
  const std::string owner = "fsdp gradient leaves (deterministic) of '" + label + "'";
  MemoryOwner owning(owner);
  NoGradGuard no_grad;
  Tensor packed = zeros({int64_t(shard_group_->size()), grad_numel_}, {.dtype = reduce_dtype_, .device = compute_device_});
  std::vector<Tensor> unused;  // packed on the current stream, which is done with them in order
  pack_grads(params_, packed, unused);
  grad_leaves_.add({packed});
}

// The reduction's label names the parameters no gradient reached and the frozen ones: ranks that leave different
// ones without (each would step what the others do not) or froze different ones fail the collective check together.
std::string FSDPParamGroup::reduce_label() const {
  std::vector<std::string> none, frozen;
  for (auto& p : params_)
    if (!p->requires_grad() || !p->grad_reached()) (p->requires_grad() ? none : frozen).push_back(p->name());
  const std::string what = none.empty() ? label : fmt::format("{} (no gradient: {})", label, fmt::join(none, ", "));
  return frozen.empty() ? what : fmt::format("{} (frozen: {})", what, fmt::join(frozen, ", "));
}

void FSDPParamGroup::start_reduce_scatter() {
  if (pending_rs_) finish_reduce_scatter();
  if (grad_numel_ == 0) return;  // every parameter frozen: nothing to reduce
  const std::string what = reduce_label();
  stats.reduce_scatter_elements += shard_group_->size() * grad_numel_;
  const std::string owner = "fsdp reduce-scatter of '" + label + "'";
  MemoryOwner owning(owner);
  if (grad_leaves_.leaves() > 0) {
    const int64_t n = grad_leaves_.leaves();
    WEFT_CHECK(!replicate_group_ || replicate_group_->size() == 1,
               "fsdp: deterministic mode reduces over a 1-D mesh only; '{}' is replicated over {} ranks (HSDP)", label,
               replicate_group_->size());
    WEFT_CHECK((n & (n - 1)) == 0, "fsdp: deterministic mode needs a power-of-two number of backwards per gradient "
               "reduction on each rank (so that each rank's sum is one node of the tree at any world size); '{}' "
               "reduces after {}", label, n);
    pending_rs_ = std::make_unique<ReduceScatterResult>(
        ordered_reduce_scatter(*comm_, grad_leaves_.total()[0], shard_group_, compute_device_, what));
    ++stats.reduce_scatters;
    return;
  }
  bool average = reduce_scatter_divide_factor == 0;
  pending_rs_ = std::make_unique<ReduceScatterResult>(
      reduce_scatter(*comm_, params_, shard_group_, grad_numel_, reduce_dtype_, compute_device_,
                     average ? dist::ReduceOp::avg : dist::ReduceOp::sum, what));
  ++stats.reduce_scatters;
}

void FSDPParamGroup::finish_reduce_scatter() {
  if (!pending_rs_) return;
  auto pending = std::move(pending_rs_);
  const std::string owner = "fsdp sharded gradients of '" + label + "'";
  MemoryOwner owning(owner);
  PostReduce post;
  if (replicate_group_ && replicate_group_->size() > 1) {
    // Without the all-reduce (HSDP gradient accumulation) the output waits in the partial sum
    // for the backward that all-reduces; the sharded gradients stay untouched until then.
    post.partial_reduce_output = &partial_reduce_output_;
    post.partial_only = !requires_all_reduce;
    post.replicate_group = replicate_group_;
    post.replicate_op = reduce_scatter_divide_factor == 0 ? dist::ReduceOp::avg : dist::ReduceOp::sum;
  }
  post.divide_factor = reduce_scatter_divide_factor;
  // The ordered reduction sums; an average divides afterwards, by the group's size.
  if (pending->recv.defined() && post.divide_factor == 0) post.divide_factor = shard_group_->size();
  post.offload = offload_;
  post.pin_host = offload_ && is_pinned(flat_shard_.data_ptr(), compute_device_);
  stats.all_reduces += reduce_scatter_accumulate(*comm_, std::move(*pending), params_, compute_device_, post);
}

}  // namespace weft::fsdp
