// dist: ProcessGroup (a set of ranks that run collectives together) and Work (the handle of
// one collective in flight). Collectives are asynchronous: each call checks its tensors,
// queues the collective and returns at once; Work::wait() blocks until it is done.
//
// Issue a group's collectives from one thread at a time (their sequence numbers follow the
// calls). Rules shared by every backend, as in torch.distributed:
// - every rank of a group issues the same collectives, with the same sizes and dtypes, in
//   the same order. The MPI backend checks this before it touches any buffer: the ranks
//   all-reduce a fingerprint of each call (sequence number, kind, dtype, sizes, op, root,
//   label) first, and on a mismatch every rank throws the same error naming the calls
//   (WEFT_DIST_DEBUG=1 exchanges the full descriptions every time instead);
// - tensors handed to a collective stay untouched until its Work completes (the backend
//   reads and writes them in the background; the Work keeps them alive);
// - every wait has a timeout (dist::collective_timeout()); a collective that does not finish
//   in time prints what it was and brings the whole job down with MPI_Abort.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../core/allocator.h"
#include "../core/tensor.h"

namespace weft::dist {

enum class ReduceOp : uint8_t { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

enum class CollectiveKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, all_to_all };
std::string_view collective_name(CollectiveKind kind);  // "all_gather_into_tensor", ...

// What one collective call was: for error messages, the debug check and traces.
struct CollectiveInfo {
  CollectiveKind kind = CollectiveKind::barrier;
  uint64_t seq = 0;  // 1, 2, ... per group, in issue order
  DType dtype = DType::f32;
  int64_t in_numel = 0, out_numel = 0;
  ReduceOp op = ReduceOp::sum;  // reduce_scatter, all_reduce
  int root = 0;                 // broadcast
  std::string group;            // the group's name, e.g. "world" or "mesh.shard"
  int group_size = 1;
  uint64_t group_id = 0;        // unique per group in this process
  std::string label;            // who issued it (CollectiveLabel), e.g. "fsdp 'h.0' FORWARD"
  // "all_gather_into_tensor #5 (f32, in 3 elements, out 6)", then " [label]" if labelled
  std::string call() const;
  std::string str() const;  // call() + " on group 'world' (2 ranks)"
};

// Names the code that issues collectives on this thread while it lives, for error messages, the fingerprint check and
// the flight recorder (dist/flight_recorder.h). Nested labels join with ": ". A label is part of each collective's
// fingerprint, so it must be the same text on every rank (no rank numbers, no timings).
//
//   dist::CollectiveLabel label("fsdp 'h.0' FORWARD");
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string_view label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;
  static const std::string& current();  // "" when none is set

 private:
  size_t previous_length_;
  MemoryOwner owner_;  // memory allocated in the scope is named by the label too
};

class Work {
 public:
  virtual ~Work() = default;
  // True once the collective has finished (or failed); never blocks.
  virtual bool is_completed() = 0;
  // Blocks until done; throws weft::Error if the collective failed. Past the timeout (seconds, above 0 and at most 1e9;
  // the default is dist::collective_timeout()) it prints the collective and aborts the job.
  void wait();
  virtual void wait(double timeout_seconds) = 0;
  // Device backends (NCCL): makes the work queued from now on on the calling thread's current CUDA stream of the
  // group's device wait for this collective on the device, without blocking the host, and returns true. Such a wait has
  // no timeout of its own: a collective that never finishes shows up at the next host wait (Work::wait, a stream
  // synchronize). Host backends (MPI) return false: call wait() instead.
  virtual bool wait_on_current_stream() { return false; }
  const CollectiveInfo& info() const { return info_; }

 protected:
  explicit Work(CollectiveInfo info) : info_(std::move(info)) {}
  CollectiveInfo info_;
};

using WorkPtr = std::shared_ptr<Work>;

// One checked collective as a backend receives it; `in` and `out` are the same tensor for
// in-place ones (all_reduce, broadcast) and undefined for barrier.
struct Collective {
  CollectiveInfo info;
  Tensor in, out;
  bool in_place_gather = false;  // an all-gather whose `in` is out's own slice
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }  // this process's rank in the group
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // members, by group rank
  virtual std::string_view backend() const = 0;                         // "mpi" or "nccl"
  virtual Device device() const = 0;  // where its tensors live (cpu, or this rank's GPU)
  uint64_t num_collectives() const { return seq_; }  // issued so far
  // Frees the group's communicator; later collectives on it throw. dist::finalize() closes every group still alive.
  virtual void close() = 0;
  bool closed() const { return closed_; }

  // out.numel() == size() * in.numel(); out holds every rank's `in` in rank order.
  // `in` may be out's own slice at rank() * in.numel() (gathers in place, no copy).
  WorkPtr all_gather_into_tensor(const Tensor& out, const Tensor& in);
  // in.numel() == size() * out.numel(); out = op over ranks of in's slice at rank() * out.numel().
  WorkPtr reduce_scatter_tensor(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum);
  WorkPtr all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);  // in place
  WorkPtr broadcast(const Tensor& tensor, int root);                    // in place; root's values
  WorkPtr barrier();
  // Equal splits: in and out hold size() blocks; block j of in goes to rank j, and block i of out comes from rank i.
  WorkPtr all_to_all_single(const Tensor& out, const Tensor& in);

 protected:
  ProcessGroup(std::string name, int rank, int size, std::vector<int> world_ranks);
  bool closed_ = false;
  virtual WorkPtr launch(Collective c) = 0;

 private:
  Collective make(CollectiveKind kind, const Tensor& out, const Tensor& in);
  std::string name_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
  uint64_t seq_ = 0;
  uint64_t id_;
  WorkPtr issue(Collective c);  // numbers, labels and records the call, then launches it
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// `seconds` when a wait can keep it as a timeout (above 0, at most 1e9: longer would overflow the
// clock); else throws naming `what`. Each backend's Work::wait checks its argument with it.
double checked_timeout(double seconds, const char* what);

}  // namespace weft::dist
