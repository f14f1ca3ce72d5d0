// core: per-device allocators and the memory counters FSDP's tests and benchmarks read. Counters track the bytes
// callers asked for (exact, no rounding), like torch.cuda.memory_stats' "allocated_bytes"; `reserved_bytes` is what the
// allocator holds from the system (equal to live bytes on CPU; a caching CUDA allocator holds more). An opt-in timeline
// of live bytes (start_memory_recording) feeds memory-over-time plots. A memory limit per device (WEFT_MEMORY_LIMIT,
// set_memory_limit) turns an allocation that would pass it into an OutOfMemoryError naming the request, the live bytes,
// the limit and the largest live allocations by owner (MemoryOwner scopes name them).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "device.h"
#include "error.h"

namespace weft {

struct MemoryStats {
  int64_t live_bytes = 0;       // currently allocated
  int64_t peak_bytes = 0;       // highest live_bytes since start or the last reset
  int64_t reserved_bytes = 0;   // held from the system (CPU: same as live)
  int64_t total_allocated_bytes = 0;  // sum over all allocations
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
};

// One point of a memory timeline: live bytes just after an allocation or a free.
struct MemorySample {
  int64_t t_ns = 0;       // std::chrono::steady_clock time, ns since its epoch
  int64_t live_bytes = 0;
};

// Live bytes by owner (MemoryOwner scopes, labels) at the highest point of an owner
// accounting (start_owner_accounting below).
struct OwnerPeak {
  int64_t peak_bytes = 0;                  // the largest sum of accounted live bytes
  std::string at;                          // the owner of the allocation that reached it
  std::map<std::string, int64_t> by_owner; // at that moment ("" for allocations no scope named)
};

struct MemoryTimeline {
  std::vector<MemorySample> samples;  // in the order the changes were recorded
  int64_t dropped = 0;                // changes after the capacity was full (not stored)
};

// An allocation refused by a memory limit (or by the device itself).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() {}

  // Timeline recording; see start_memory_recording below.
  void start_recording(size_t capacity);
  MemoryTimeline stop_recording();

  // The cap on live bytes (0: none); see set_memory_limit below.
  void set_limit(int64_t bytes);
  int64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  // Names a live allocation in out-of-memory reports (kept only while a limit is set).
  void label(void* ptr, std::string owner);

  // Owner accounting; see start_owner_accounting below.
  void start_accounting();
  void reset_accounting_peak();
  OwnerPeak stop_accounting();

 protected:
  // Implementations: the cap from WEFT_MEMORY_LIMIT (called from their constructor).
  void apply_env_limit();
  // Throws OutOfMemoryError if `nbytes` more than `live_bytes` would pass the limit; `name`
  // is the device ("cpu", "cuda:0").
  void check_limit(size_t nbytes, int64_t live_bytes, const std::string& name);
  // Around every allocation and free: remembers the owner of allocations made inside a
  // MemoryOwner scope while a limit is set (one relaxed load otherwise).
  void track(void* ptr, size_t nbytes) {
    if (limit() > 0 || accounting_.load(std::memory_order_relaxed)) track_slow(ptr, nbytes);
  }
  void untrack(void* ptr) {
    if (tracking_.load(std::memory_order_relaxed)) untrack_slow(ptr);
  }

  // Implementations call this after every change of live bytes with the new value. When no
  // recording runs it costs one relaxed atomic load.
  void record_live(int64_t live_bytes) {
    if (recording_.load(std::memory_order_relaxed)) record_slow(live_bytes);
  }

 private:
  void record_slow(int64_t live_bytes);
  void track_slow(void* ptr, size_t nbytes);
  void untrack_slow(void* ptr);
  std::atomic<int64_t> limit_{0};
  std::atomic<bool> tracking_{false};
  std::mutex owners_mutex_;
  struct Owned {
    int64_t bytes;
    std::string owner;
    bool accounted = false;  // allocated during an owner accounting
  };
  std::unordered_map<void*, Owned> owners_;
  std::atomic<bool> accounting_{false};
  std::map<std::string, int64_t> accounted_live_;  // under owners_mutex_
  int64_t accounted_total_ = 0;
  OwnerPeak accounted_peak_;
  std::atomic<bool> recording_{false};
  std::mutex record_mutex_;  // allocations come from OpenMP and communication threads too
  MemoryTimeline timeline_;
  size_t capacity_ = 0;
};

// The allocator for a device; throws if that device's backend is not built or registered.
Allocator& allocator_for(Device device);
// Backends (e.g. cuda/) install their allocator here at start-up.
void register_allocator(DeviceType type, Allocator* allocator);
// Backends with one allocator per device index install a lookup instead (cuda/ does).
// It runs on every allocator_for(device) of that type and throws for a device that does not
// exist; registering it must not touch the device (it runs at static initialisation).
using AllocatorLookup = Allocator& (*)(int index);
void register_allocator_lookup(DeviceType type, AllocatorLookup lookup);

// Whether the CPU allocator keeps freed blocks for reuse (WEFT_CPU_CACHE; off in sanitizer
// builds). allocator_for(Device::cpu()).empty_cache() returns them to the system.
bool cpu_block_cache_enabled();
// Lowers what the cache keeps beyond the blocks freed under the peak of live bytes to `bytes` (at least 1; never
// raised): a run whose planned peak comes near the memory it has leaves the cache only the rest. Returns the limit.
int64_t limit_cpu_block_cache(int64_t bytes);

MemoryStats memory_stats(Device device = Device::cpu());
void reset_peak_memory_stats(Device device = Device::cpu());

// Memory limit: an allocation that would bring the device's live bytes (as memory_stats counts them) past `bytes`
// throws OutOfMemoryError instead; 0 removes the limit. The WEFT_MEMORY_LIMIT environment variable sets it for the CPU
// and every CUDA device when their allocator is first used: a byte count with an optional suffix K, M, G, T (powers of
// 1024; KiB, MiB, GiB, TiB too), e.g. 512M. Pinned host staging memory is not capped.
void set_memory_limit(Device device, int64_t bytes);
int64_t memory_limit(Device device = Device::cpu());
// Parses a byte count as WEFT_MEMORY_LIMIT takes it; throws weft::Error naming `what` if bad.
int64_t parse_bytes(const std::string& text, const std::string& what);
// A byte count for messages and tables: "12.3 MiB" (MiB = 2^20 bytes).
std::string format_mib(int64_t bytes);

// Names what the memory allocated on this thread during its scope is for, in out-of-memory
// reports ("fsdp 'blocks.0' FORWARD", "forward of Block"). Scopes nest: the innermost names.
// `owner` must outlive the scope. Costs a thread-local push and pop.
class MemoryOwner {
 public:
  explicit MemoryOwner(const std::string& owner);
  ~MemoryOwner();
  MemoryOwner(const MemoryOwner&) = delete;
  MemoryOwner& operator=(const MemoryOwner&) = delete;
  // The innermost owner on this thread, or null.
  static const std::string* current();
  // Whether any device has a limit (owners are only remembered then).
  static bool wanted();

 private:
  const std::string* previous_;
};

// Owner accounting: from start_owner_accounting until stop_owner_accounting, the device's allocator sums the live bytes
// of each owner (the innermost MemoryOwner scope of the allocation, or its label) over the allocations made in between,
// and keeps that split at the highest total. reset_owner_accounting_peak starts the highest point again from the
// present. fsdp::plan_memory runs a training step on the meta device under it to say what the peak is made of. Costs a
// map update per allocation while on (meant for the meta device).
void start_owner_accounting(Device device);
void reset_owner_accounting_peak(Device device);
OwnerPeak stop_owner_accounting(Device device);

// Memory timeline: from start_memory_recording until stop_memory_recording, the device's allocator appends (time, live
// bytes) after every allocation and free, from any thread, up to `capacity` samples (16 bytes each, held outside the
// counted memory; later changes are counted in `dropped`). Every change is kept, so with the peak reset at the start,
// the peak is the largest sample (or the live bytes at the start). Off by default, when it costs one relaxed atomic
// load per allocation and free. Starting again discards an unfinished timeline. The CPU allocator records; a device
// allocator takes part by calling Allocator::record_live.
void start_memory_recording(Device device = Device::cpu(), size_t capacity = size_t(1) << 22);
MemoryTimeline stop_memory_recording(Device device = Device::cpu());

}  // namespace weft
