#include "fsdp/param_group.h"

#include "core/copy.h"
#include "core/grad_mode.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#if WEFT_WITH_CUDA
#include <optional>

#include "fsdp/device_sync.h"
#include "kernels/cuda/allocator.h"
#endif

namespace weft::fsdp {

#if WEFT_WITH_CUDA
namespace cu = kernels::cuda;
#endif

// A reduce-scatter in flight: its buffers, and the unsharded gradients it packed (read by the
// reduce-scatter stream on CUDA, so kept until that use is known to be done).
struct FSDPParamGroup::PendingReduce {
  dist::WorkPtr work;
  Tensor send, out;
  std::vector<Tensor> grads;
};

FSDPParamGroup::~FSDPParamGroup() = default;

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
  compute_device_ = device;
  // CPU offload only means something for CUDA parameters: CPU ones are already on the host.
  offload_ = opts.offload_policy.has_value() && device.is_cuda();
  if (offload_) {
#if WEFT_WITH_CUDA
    // Pinned, so that the all-gather's upload and the gradients' download are asynchronous.
    flat_shard_ = opts.offload_policy->pin_memory ? cu::empty_pinned({group_numel_}, dtype)
                                                  : empty({group_numel_}, {.dtype = dtype});
    flat_shard_.zero_();
#endif
  } else {
    flat_shard_ = zeros({group_numel_}, {.dtype = dtype, .device = device});
  }
  int64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    params_.push_back(std::make_unique<FSDPParam>(entries[i].name, entries[i].slots, entries[i].shard_dim, rank,
                                                  world, flat_shard_, offset));
    offset += padded[i];
    if (offload_) params_.back()->set_pin_grads(opts.offload_policy->pin_memory);
  }
#if WEFT_WITH_CUDA
  // The shards were copied from the device into pinned memory asynchronously; the host (an
  // optimizer, a state dict) may read them as soon as fully_shard returns.
  if (offload_) cu::current_stream(device.index).synchronize();
#endif
  label = params_[0]->name();
  param_dtype_ = opts.mp_policy.param_dtype.value_or(dtype);
  reduce_dtype_ = opts.mp_policy.reduce_dtype.value_or(param_dtype_);
  for (auto& p : params_) p->use_sharded();
}

void FSDPParamGroup::start_unshard() {
  if (state_ != State::sharded && state_ != State::partial) return;
  gather_started_us_ = trace::enabled() ? trace::now_us() : 0;
#if WEFT_WITH_CUDA
  // On CUDA the copy-in and the collective are issued from the all-gather stream, after the
  // work already queued on the compute stream (the optimizer's update of the shards, or the
  // forward that filled the partial shard); the NCCL stream then waits for the copy-in. Buffers
  // made here are allocated on the all-gather stream.
  std::optional<cu::StreamGuard> on_gather_stream;
  if (compute_device_.is_cuda()) {
    detail::release_completed();
    cu::Stream gather_stream = detail::comm_streams(compute_device_.index).all_gather;
    cu::Event shards_ready;
    shards_ready.record(cu::current_stream(compute_device_.index));
    gather_stream.wait(shards_ready);
    on_gather_stream.emplace(gather_stream);
  }
#endif
  if (state_ == State::partial) {
    // Gather within the subgroup from the chunks kept after forward.
    gather_send_ = partial_shard_;
    gather_recv_ = empty({int64_t(partial_group_->size()), partial_shard_.numel()},
                         {.dtype = partial_shard_.dtype(), .device = partial_shard_.device()});
    gather_work_ = partial_group_->all_gather_into_tensor(gather_recv_.view({-1}), gather_send_);
    gathering_partial_ = true;
  } else {
    const int world = shard_group_->size();
    // The shard buffer is sent as is unless parameters are gathered in another dtype or it is
    // offloaded (then uploaded first: from pinned memory, asynchronously on this stream).
    Tensor shard = offload_ ? flat_shard_.to(compute_device_) : flat_shard_;
    gather_send_ = param_dtype_ == shard.dtype() ? shard : shard.to(param_dtype_);
    gather_recv_ = empty({int64_t(world), group_numel_}, {.dtype = param_dtype_, .device = compute_device_});
    gather_work_ = shard_group_->all_gather_into_tensor(gather_recv_.view({-1}), gather_send_);
    gathering_partial_ = false;
  }
  ++stats.all_gathers;
  state_ = State::gathering;
}

void FSDPParamGroup::finish_unshard() {
  if (state_ == State::unsharded) return;
  if (state_ == State::sharded || state_ == State::partial) start_unshard();
  bool on_device = false;  // the compute stream waits for the all-gather, the host does not
  {
    trace::Span span("wait all_gather", "fsdp");
#if WEFT_WITH_CUDA
    if (compute_device_.is_cuda()) on_device = gather_work_->wait_on_current_stream();
#endif
    if (!on_device) gather_work_->wait();
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
#if WEFT_WITH_CUDA
  if (on_device) {
    // The buffers belong to the all-gather stream and were just read on the compute stream:
    // kept until the copy-out has run.
    cu::Event copied;
    copied.record(cu::current_stream(compute_device_.index));
    detail::release_after(std::move(copied), {gather_send_, gather_recv_, partial_shard_}, {gather_work_});
  }
#endif
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
#if WEFT_WITH_CUDA
  // On CUDA the gradients are packed and reduce-scattered from the reduce-scatter stream once
  // the compute stream has produced them.
  std::optional<cu::StreamGuard> on_reduce_stream;
  if (compute_device_.is_cuda()) {
    detail::release_completed();
    cu::Stream reduce_stream = detail::comm_streams(compute_device_.index).reduce_scatter;
    cu::Event grads_ready;
    grads_ready.record(cu::current_stream(compute_device_.index));
    reduce_stream.wait(grads_ready);
    on_reduce_stream.emplace(reduce_stream);
  }
#endif
  auto pr = std::make_unique<PendingReduce>();
  pr->send = zeros({int64_t(world), group_numel_}, {.dtype = reduce_dtype_, .device = compute_device_});
  for (auto& p : params_) {
    p->copy_in_grad(pr->send);
    if (compute_device_.is_cuda() && p->has_unsharded_grad()) pr->grads.push_back(p->unsharded().grad());
    p->clear_unsharded_grad();
  }
  pr->out = empty({group_numel_}, {.dtype = reduce_dtype_, .device = compute_device_});
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
#if WEFT_WITH_CUDA
  if (compute_device_.is_cuda()) {
    finish_reduce_scatter_on_device(*pr);
    return;
  }
#endif
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

#if WEFT_WITH_CUDA
// The CUDA version of the end of a reduction, without host waits unless offloading:
// - on the device: the stream that runs the rest (the compute stream; with offload the
//   reduce-scatter stream) waits for the reduce-scatter's event, then the HSDP all-reduce is
//   issued from it and waited for the same way, then the divide and the accumulation run;
// - with offload: the result is copied to pinned host memory on the reduce-scatter stream, the
//   host waits for that copy (the optimizer steps on the CPU next) and accumulates on the CPU;
// - otherwise the buffers, used on the compute stream but allocated on the reduce-scatter
//   stream, are kept until an event after the accumulation completes.
void FSDPParamGroup::finish_reduce_scatter_on_device(PendingReduce& pr) {
  const int device = compute_device_.index;
  NoGradGuard no_grad;
  std::optional<cu::StreamGuard> on_reduce_stream;
  if (offload_) on_reduce_stream.emplace(detail::comm_streams(device).reduce_scatter);
  auto device_wait = [](const dist::WorkPtr& w) {
    if (!w->wait_on_current_stream()) w->wait();
  };
  {
    trace::Span span("wait reduce_scatter", "fsdp");
    device_wait(pr.work);
  }
  if (rs_started_us_)
    trace::record("reduce_scatter " + label, "comm", rs_started_us_, trace::now_us() - rs_started_us_, 1);
  std::vector<dist::WorkPtr> works{pr.work};
  if (replicate_group_ && replicate_group_->size() > 1 && requires_all_reduce) {
    bool average = reduce_scatter_divide_factor == 0;
    works.push_back(replicate_group_->all_reduce(pr.out, average ? dist::ReduceOp::avg : dist::ReduceOp::sum));
    device_wait(works.back());
    ++stats.all_reduces;
  }
  if (reduce_scatter_divide_factor != 0) kernels::mul_scalar_(pr.out, 1.0 / reduce_scatter_divide_factor);
  if (offload_) {
    // Pinned like the shards (CPUOffloadPolicy::pin_memory), so the download is asynchronous.
    Tensor host = cu::is_pinned(flat_shard_.data_ptr()) ? cu::empty_pinned(pr.out.shape(), pr.out.dtype())
                                                       : empty(pr.out.shape(), {.dtype = pr.out.dtype()});
    host.copy_(pr.out);
    cu::Event downloaded;
    downloaded.record(cu::current_stream(device));
    downloaded.synchronize();
    on_reduce_stream.reset();
    for (auto& p : params_) p->accumulate_sharded_grad(host);
    return;  // everything above has completed: the buffers can go
  }
  for (auto& p : params_) p->accumulate_sharded_grad(pr.out);
  cu::Event accumulated;
  accumulated.record(cu::current_stream(device));
  std::vector<Tensor> keep = std::move(pr.grads);
  keep.push_back(pr.send);
  keep.push_back(pr.out);
  detail::release_after(std::move(accumulated), std::move(keep), std::move(works));
}
#endif

}  // namespace weft::fsdp
