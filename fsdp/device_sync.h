// fsdp: the CUDA streams FSDP's collectives are issued from, and the buffers they share with
// the compute stream. Internal (not installed); only built with CUDA (WEFT_WITH_CUDA).
//
// Per device, one all-gather stream (copy-in of the shards, then the all-gather) and one
// reduce-scatter stream (packing of the gradients, then the reduce-scatter; with offload the
// copy of the result to the host), shared by every parameter group on that device so that
// groups' collectives stay in issue order. The collectives themselves run on the NCCL group's
// stream, which waits for the issuing stream (dist/nccl_backend.cpp).
//
// A buffer allocated on one stream and used on another may only be freed once the other
// stream's use is known to be done (kernels/cuda/allocator.h): release_after() holds tensors
// (and the collectives' Work, which hold theirs) until an event recorded after their last use
// has completed. Nothing is guessed from stream order.
#pragma once
#if WEFT_WITH_CUDA
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "kernels/cuda/runtime.h"

namespace weft::fsdp::detail {

struct CommStreams {
  kernels::cuda::Stream all_gather;
  kernels::cuda::Stream reduce_scatter;
};
// The streams of cuda:device (created on first use, kept for the process).
CommStreams& comm_streams(int device);

// Keeps `tensors` and `works` alive until `done` (recorded after their last use) completes.
// Also drops whatever earlier calls kept that has completed since.
void release_after(kernels::cuda::Event done, std::vector<Tensor> tensors, std::vector<dist::WorkPtr> works = {});
// Drops what has completed; never blocks.
void release_completed();
// Waits on the host for everything still kept, then drops it.
void release_all();

}  // namespace weft::fsdp::detail
#endif
