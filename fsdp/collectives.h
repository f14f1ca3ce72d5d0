// fsdp: FSDP's collectives as free functions, apart from the parameter group's unshard / reshard / reduce logic (as
// PyTorch's _fully_shard/_fsdp_collectives.py). Internal (not installed).
//
//   unshard: all_gather (copy-in of the flat shard into the send buffer, then one all-gather
//            into [ranks, columns]), wait_all_gather, all_gather_copy_out (views into each
//            unsharded parameter);
//   reduce:  reduce_scatter (gradient packing into [ranks, columns], then one reduce-scatter),
//            reduce_scatter_accumulate (wait, HSDP all-reduce, divide, accumulate into each
//            sharded .grad).
//
// Device-neutral: the copy-in and the collective are issued from the communication context's
// streams after the compute stream's queued work, and the compute stream waits for the
// collective on the device where the backend can (dist::Work::wait_on_current_stream), else
// the host waits. On the CPU every stream is the CPU stream and these orderings are no-ops.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../core/stream.h"
#include "../dist/process_group.h"
#include "comm_context.h"
#include "fsdp_param.h"

namespace weft::fsdp {

using FSDPParams = std::vector<std::unique_ptr<FSDPParam>>;

// An all-gather in flight.
struct AllGatherResult {
  dist::WorkPtr work;
  dist::ProcessGroupPtr group;
  Tensor send, recv;     // recv: [group size, columns]
  Event issued;          // on the all-gather stream, after the copy-in and the collective's issue
  bool on_device = false;  // wait_all_gather: the compute stream (not the host) waited
  std::string label;       // for traces: the group's module path
  uint64_t started_us = 0;
};

// Copy-in: the all-gather's send buffer from a flat shard buffer — the buffer itself when it already has `dtype` and
// lives on `device`, else its cast or upload (from pinned host memory, asynchronous on the current stream).
Tensor all_gather_copy_in(const Tensor& flat_shard, DType dtype, Device device);

// Issues the copy-in and the all-gather of `flat_shard` over `group` from ctx's all-gather
// stream of `device`, after the work queued so far on the current stream (which may still be
// writing the shards: the optimizer's step, the forward that filled a partial shard).
AllGatherResult all_gather(CommContext& ctx, const Tensor& flat_shard, DType dtype, Device device,
                           const dist::ProcessGroupPtr& group, std::string label);

// Makes the current stream wait for the all-gather (device backends), or the host (host
// backends); records the trace span of the collective.
void wait_all_gather(AllGatherResult& result);

// Copy-out: builds each unsharded parameter from the gathered buffer, parameter i at columns
// `offsets[i]` of each rank's row, cut into the group's size of chunks. The buffers are handed
// to ctx until the copy-out has run on the device.
void all_gather_copy_out(CommContext& ctx, AllGatherResult&& result, const FSDPParams& params, DType dtype,
                         const std::vector<int64_t>& offsets);

// A reduce-scatter in flight.
struct ReduceScatterResult {
  dist::WorkPtr work;
  Tensor send, out;  // send: [ranks, columns] packed gradients; out: [columns] this rank's sum
  Tensor recv;       // ordered: [ranks, columns], every rank's partial of this rank's columns
  // The unsharded gradients packed, which the reduce-scatter stream may still read (devices
  // other than the CPU), kept until that use is known to be done.
  std::vector<Tensor> grads;
  std::string label;  // for traces
  uint64_t started_us = 0;
};

// Gradient packing: each parameter's unsharded gradient into its columns of `send`
// [ranks, columns] (zeros where no gradient reached), then drops the unsharded gradients.
// Appends to `in_use` those the device may still be reading (not on the CPU).
void pack_grads(const FSDPParams& params, const Tensor& send, std::vector<Tensor>& in_use);

// Issues the packing and the reduce-scatter of the group's gradients over `group` from ctx's reduce-scatter stream of
// `device`, after the current stream's queued work (which produced the gradients).
ReduceScatterResult reduce_scatter(CommContext& ctx, const FSDPParams& params, const dist::ProcessGroupPtr& group,
                                   int64_t columns, DType dtype, Device device, dist::ReduceOp op, std::string label);

// Deterministic mode's reduce-scatter: `send` [ranks, columns] (a tree's sum of packed gradients) goes out by an
// all-to-all, so that each rank receives every rank's partial of its columns, which reduce_scatter_accumulate sums in
// rank order along the tree (nn/tree_sum.h) instead of in the collective's order. Issued like reduce_scatter (no
// division: the caller's PostReduce::divide_factor).
ReduceScatterResult ordered_reduce_scatter(CommContext& ctx, Tensor send, const dist::ProcessGroupPtr& group,
                                           Device device, std::string label);

// What happens after the reduce-scatter.
struct PostReduce {
  dist::ProcessGroupPtr replicate_group;  // HSDP: all-reduced over these ranks (null: none)
  dist::ReduceOp replicate_op = dist::ReduceOp::avg;
  double divide_factor = 0;  // 0: none
  bool offload = false;      // accumulate into host (CPU-offloaded) sharded gradients
  bool pin_host = false;     // with offload: download into pinned host memory
  // HSDP gradient accumulation (set_requires_all_reduce): reduce-scatter outputs that were not
  // all-reduced yet, summed. With `partial_only` the output is added here and nothing else
  // happens; otherwise a defined sum is added to the output before its all-reduce, and reset.
  Tensor* partial_reduce_output = nullptr;
  bool partial_only = false;
};

// The post-reduce accumulate: waits for the reduce-scatter (the stream that runs the rest waits on the device, else the
// host), runs the HSDP all-reduce, divides, and accumulates into each parameter's sharded .grad — with offload after
// downloading to the host, waited for, as the optimizer steps on the host next; or, with post.partial_only, only adds
// the output to post.partial_reduce_output. Returns the number of all-reduces issued.
int reduce_scatter_accumulate(CommContext& ctx, ReduceScatterResult&& result, const FSDPParams& params, Device device,
                              const PostReduce& post);

}  // namespace weft::fsdp
