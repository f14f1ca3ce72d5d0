#include "fsdp/collectives.h"

#include <optional>

#include "core/device_runtime.h"
#include "core/grad_mode.h"
#include "core/stream.h"
#include "core/trace.h"
#include "kernels/elementwise.h"
#include "nn/tree_sum.h"

namespace weft::fsdp {

namespace {

// The stream that runs the code after it is made current waits for the work queued so far on `device`'s current stream.
StreamGuard after_current_stream(const Stream& stream, Device device) {
  Event ready;
  ready.record(current_stream(device));
  stream.wait(ready);
  return StreamGuard(stream);
}

// The current stream waits for `work` on the device where its backend can, else the host.
void wait_on_stream(const dist::WorkPtr& work) {
  if (!work->wait_on_current_stream()) work->wait();
}

}  // namespace

Tensor all_gather_copy_in(const Tensor& flat_shard, DType dtype, Device device) {
  Tensor shard = flat_shard.device() == device ? flat_shard : flat_shard.to(device);
  return shard.dtype() == dtype ? shard : shard.to(dtype);
}

AllGatherResult all_gather(CommContext& ctx, const Tensor& flat_shard, DType dtype, Device device,
                           const dist::ProcessGroupPtr& group, std::string label) {
  ctx.release_completed();
  AllGatherResult r;
  r.label = std::move(label);
  r.started_us = trace::enabled() ? trace::now_us() : 0;
  r.group = group;
  // Buffers made here are allocated on the all-gather stream.
  Stream stream = ctx.all_gather_stream(device);
  StreamGuard on_gather_stream = after_current_stream(stream, device);
  r.send = all_gather_copy_in(flat_shard, dtype, device);
  r.recv = empty({int64_t(group->size()), r.send.numel()}, {.dtype = dtype, .device = device});
  dist::CollectiveLabel what("all-gather of '" + r.label + "'");
  r.work = group->all_gather_into_tensor(r.recv.view({-1}), r.send);
  r.issued.record(stream);
  return r;
}

void wait_all_gather(AllGatherResult& r) {
  {
    trace::Span span("wait all_gather", "fsdp");
    current_stream(r.recv.device()).wait(r.issued);
    r.on_device = r.work->wait_on_current_stream();
    if (!r.on_device) r.work->wait();
  }
  if (r.started_us)
    trace::record("all_gather " + r.label, "comm", r.started_us, trace::now_us() - r.started_us, 1);
}

void all_gather_copy_out(CommContext& ctx, AllGatherResult&& r, const FSDPParams& params, DType dtype,
                         const std::vector<int64_t>& offsets) {
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i]->copy_out(r.recv, dtype, offsets[i], r.group->size());
  }
  // The buffers belong to the all-gather stream and were just read on the current stream:
  // kept until the copy-out has run there.
  Event copied;
  copied.record(current_stream(r.recv.device()));
  ctx.release_after(std::move(copied), {std::move(r.send), std::move(r.recv)}, {std::move(r.work)});
}

void pack_grads(const FSDPParams& params, const Tensor& send, std::vector<Tensor>& in_use) {
  for (auto& p : params) {
    p->copy_in_grad(send);
    // A device's streams may still read them; on the host they are done with.
    if (!runs_on_host(send.device()) && p->has_unsharded_grad()) in_use.push_back(p->unsharded_grad());
    p->clear_unsharded_grad();
  }
}

ReduceScatterResult reduce_scatter(CommContext& ctx, const FSDPParams& params, const dist::ProcessGroupPtr& group,
                                   int64_t columns, DType dtype, Device device, dist::ReduceOp op, std::string label) {
  ctx.release_completed();
  NoGradGuard no_grad;
  ReduceScatterResult r;
  r.label = std::move(label);
  // The gradients are packed and reduce-scattered from the reduce-scatter stream once the
  // current stream has produced them.
  StreamGuard on_reduce_stream = after_current_stream(ctx.reduce_scatter_stream(device), device);
  r.send = zeros({int64_t(group->size()), columns}, {.dtype = dtype, .device = device});
  pack_grads(params, r.send, r.grads);
  r.out = empty({columns}, {.dtype = dtype, .device = device});
  r.started_us = trace::enabled() ? trace::now_us() : 0;
  dist::CollectiveLabel what("reduce-scatter of '" + r.label + "'");
  r.work = group->reduce_scatter_tensor(r.out, r.send.view({-1}), op);
  return r;
}

ReduceScatterResult ordered_reduce_scatter(CommContext& ctx, Tensor send, const dist::ProcessGroupPtr& group,
                                           Device device, std::string label) {
  ctx.release_completed();
  NoGradGuard no_grad;
  ReduceScatterResult r;
  r.label = std::move(label);
  StreamGuard on_reduce_stream = after_current_stream(ctx.reduce_scatter_stream(device), device);
  r.send = std::move(send);
  r.recv = empty(r.send.shape(), {.dtype = r.send.dtype(), .device = device});
  r.started_us = trace::enabled() ? trace::now_us() : 0;
  dist::CollectiveLabel what("ordered reduce-scatter (all-to-all) of '" + r.label + "'");
  r.work = group->all_to_all_single(r.recv.view({-1}), r.send.view({-1}));
  return r;
}

int reduce_scatter_accumulate(CommContext& ctx, ReduceScatterResult&& r, const FSDPParams& params, Device device,
                              const PostReduce& post) {
  NoGradGuard no_grad;
  // With offload the rest runs on the reduce-scatter stream, downloading there; otherwise on
  // the current (compute) stream, where the sharded gradients are used next.
  std::optional<StreamGuard> on_reduce_stream;
  if (post.offload) on_reduce_stream.emplace(ctx.reduce_scatter_stream(device));
  {
    trace::Span span("wait reduce_scatter", "fsdp");
    wait_on_stream(r.work);
  }
  if (r.started_us)
    trace::record("reduce_scatter " + r.label, "comm", r.started_us, trace::now_us() - r.started_us, 1);
  if (r.recv.defined()) {  // ordered: the ranks' partials of this shard, summed along the tree
    nn::TreeSum tree;
    for (int64_t i = 0; i < r.recv.size(0); ++i) tree.add({r.recv.select(0, i)});
    r.out = tree.total()[0];
  }
  std::vector<dist::WorkPtr> works{r.work};
  int all_reduces = 0;
  if (post.partial_reduce_output) {
    Tensor& partial = *post.partial_reduce_output;
    if (post.partial_only) {  // kept for the all-reduce of a later backward (FSDP2's partial reduce output)
      if (partial.defined()) kernels::add_(partial, r.out);
      else partial = r.out;
      Event summed;
      summed.record(current_stream(device));
      std::vector<Tensor> keep = std::move(r.grads);
      keep.push_back(std::move(r.send));
      ctx.release_after(std::move(summed), std::move(keep), std::move(works));
      return 0;
    }
    if (partial.defined()) {
      kernels::add_(r.out, partial);
      partial = Tensor();
    }
  }
  if (post.replicate_group) {
    dist::CollectiveLabel what("all-reduce of '" + r.label + "' across replicas");
    works.push_back(post.replicate_group->all_reduce(r.out, post.replicate_op));
    wait_on_stream(works.back());
    ++all_reduces;
  }
  if (post.divide_factor != 0) kernels::mul_scalar_(r.out, 1.0 / post.divide_factor);
  if (post.offload) {
    // Pinned like the shards (CPUOffloadPolicy::pin_memory), so the download is asynchronous.
    Tensor host = post.pin_host ? empty_pinned(r.out.shape(), r.out.dtype(), device)
                                : empty(r.out.shape(), {.dtype = r.out.dtype()});
    host.copy_(r.out);
    Event downloaded;
    downloaded.record(current_stream(device));
    downloaded.synchronize();
    on_reduce_stream.reset();
    for (auto& p : params) p->accumulate_sharded_grad(host);
    return all_reduces;  // everything above has completed: the buffers can go
  }
  for (auto& p : params) p->accumulate_sharded_grad(r.out);
  // Used on the current stream but allocated on the reduce-scatter stream: kept until an
  // event after the accumulation completes.
  Event accumulated;
  accumulated.record(current_stream(device));
  std::vector<Tensor> keep = std::move(r.grads);
  keep.push_back(std::move(r.send));
  keep.push_back(std::move(r.out));
  keep.push_back(std::move(r.recv));
  ctx.release_after(std::move(accumulated), std::move(keep), std::move(works));
  return all_reduces;
}

}  // namespace weft::fsdp
