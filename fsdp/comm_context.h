// fsdp: the communication context — the streams FSDP's collectives are issued from, and the buffers those streams share
// with the compute stream. Internal (not installed). Device-neutral through core/stream.h: on the CPU every stream is
// the CPU stream and every event is complete when recorded, so nothing is ever held.
//
// Per device, one all-gather stream (copy-in of the shards, then the all-gather) and one reduce-scatter stream (packing
// of the gradients, then the reduce-scatter; with offload the copy of the result to the host), shared by every
// parameter group of a root so that groups' collectives stay in issue order. A device backend's collectives run on its
// own stream, which waits for the issuing stream (dist's NCCL backend).
//
// A buffer allocated on one stream and used on another may only be freed once the other stream's use is known to be
// done ([Note: stream and event lifetimes], core/stream.h): release_after() holds tensors (and the collectives' Work,
// which hold theirs) until an event recorded after their last use has completed. Nothing is guessed from stream order.
//
// Each parameter group starts with a context of its own; the root's lazy init hands its
// context to every group under it (as FSDP2's FSDPCommContext).
#pragma once
#include <deque>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "../core/stream.h"
#include "../core/tensor.h"
#include "../dist/process_group.h"

namespace weft::fsdp {

class CommContext {
 public:
  CommContext() = default;
  ~CommContext();  // waits for what is still held
  CommContext(const CommContext&) = delete;
  CommContext& operator=(const CommContext&) = delete;

  // The streams of `device`, created on first use (the CPU stream for the CPU).
  Stream all_gather_stream(Device device);
  Stream reduce_scatter_stream(Device device);

  // Keeps `tensors` and `works` alive until `done` (recorded after their last use) completes; an event that is complete
  // already (any CPU event) drops them at once. Also drops whatever earlier calls kept that has completed since.
  void release_after(Event done, std::vector<Tensor> tensors, std::vector<dist::WorkPtr> works = {});
  // Drops what has completed; never blocks.
  void release_completed();
  // Waits on the host for everything still kept, then drops it.
  void release_all();

 private:
  struct Streams {
    Stream all_gather, reduce_scatter;
  };
  struct Kept {
    Event done;
    std::vector<Tensor> tensors;
    std::vector<dist::WorkPtr> works;
  };
  Streams& streams(Device device);
  std::vector<Kept> take_completed(bool wait);  // with mu_ held

  std::mutex mu_;
  std::map<std::pair<DeviceType, int>, Streams> streams_;
  std::deque<Kept> kept_;  // completed in the order recorded on one stream: the front first
};

}  // namespace weft::fsdp
