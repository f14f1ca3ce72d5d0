// cuda/: memory. A caching allocator per CUDA device (what Storage on cuda:i uses,
// registered with core so that weft::memory_stats(Device::cuda(i)) reports it), and a
// caching allocator of pinned (page-locked) host memory for staging and offload.
//
// The device allocator works like PyTorch's: cudaMalloc and cudaFree are slow and
// synchronising, so freed blocks are kept and reused.
// - Sizes round up to a multiple of 512 B. Requests up to 1 MiB are carved from 2 MiB
//   segments (the small pool); larger ones get a segment rounded up to 2 MiB (the large
//   pool), whose unused tail is split off as a free block when it is over 1 MiB.
// - A request takes the smallest free block of its pool that fits (best fit), splitting off
//   the rest; a freed block merges with free neighbours of its segment.
// - Blocks belong to the stream that was current when they were allocated and are reused
//   only for allocations on that stream: stream order then makes reuse safe with no
//   synchronisation (see runtime.h for the rule on using memory on other streams).
// - When cudaMalloc fails, the cached, wholly free segments are released and it is tried
//   once more; then a weft::Error says how much was asked, live, reserved and free.
// - empty_cache() returns wholly free segments to the driver; memory_stats' reserved_bytes
//   is what is held from cudaMalloc, live_bytes what callers asked for and still hold.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include <cuda_runtime.h>

#include "core/allocator.h"
#include "core/tensor.h"

namespace weft::kernels::cuda {

// Where a CachingAllocator gets its segments; abstract so that the pooling logic can be
// tested without a GPU (tests/test_cuda_allocator.cpp uses host memory).
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // nullptr when out of memory; throws for other failures.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void free(void* ptr) = 0;
  // A key of the stream current for the device (its cudaStream_t).
  virtual uintptr_t current_stream() = 0;
  // Appended to out-of-memory messages, e.g. the device's free and total memory.
  virtual std::string describe() { return ""; }
};

// Counters of the pooling beyond core's MemoryStats.
struct CacheStats {
  int64_t segments = 0;               // segments held from the source now
  int64_t segment_allocs = 0;         // source allocations so far (cudaMalloc calls)
  int64_t segment_frees = 0;          // source frees so far (cudaFree calls)
  int64_t cache_hits = 0;             // allocations served from a free block
  int64_t block_bytes = 0;            // bytes of blocks handed out (sizes after rounding)
  int64_t peak_reserved_bytes = 0;    // highest reserved bytes since start or the last reset
  int64_t oom_retries = 0;            // times the cache was emptied to retry a failed allocation
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;                // every size rounds up to a multiple
  static constexpr size_t kSmallRequest = 1u << 20;   // up to this: the small pool
  static constexpr size_t kSmallSegment = 2u << 20;   // segment size of the small pool
  static constexpr size_t kLargeRound = 2u << 20;     // large segments round up to this

  // `name` appears in error messages ("cuda:0").
  CachingAllocator(std::unique_ptr<MemorySource> source, std::string name);
  ~CachingAllocator() override;  // returns every segment to the source

  void* allocate(size_t nbytes) override;  // on the source's current stream
  void* allocate(size_t nbytes, uintptr_t stream);
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;
  CacheStats cache_stats() const;

  static size_t round_size(size_t nbytes);      // multiple of kRound (at least kRound)
  static size_t segment_size(size_t rounded);   // what the source is asked for

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;           // after rounding / splitting
    size_t requested = 0;      // what the caller asked for (while allocated)
    uintptr_t stream = 0;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;     // neighbours in the same segment
    Block* next = nullptr;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  void release_free_segments();  // with mu_ held
  Pool& pool_of(bool small) { return small ? small_free_ : large_free_; }

  std::unique_ptr<MemorySource> source_;
  std::string name_;
  mutable std::mutex mu_;
  Pool small_free_, large_free_;
  std::unordered_map<void*, Block*> allocated_;
  MemoryStats stats_;
  CacheStats cache_;
};

// The allocator of cuda:index (created on first use; throws if the device does not exist).
CachingAllocator& device_allocator(int index);

// ---- pinned host memory
// Page-locked host memory: copies between it and a device run asynchronously on the current
// stream (pageable memory makes them synchronous, see copy.cpp). Blocks are cached by size
// (rounded up to a power of two). A freed block is reused only once the work queued on the
// current stream at the time of the free has finished, so an async copy still reading it is
// never overwritten. Its counters are reported by pinned_memory_stats(), not by
// memory_stats(kCPU): pinned memory is a CUDA resource.
class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;  // waits for pending frees, then cudaFreeHost's every cached block
  // Whether p points into a live pinned block (any offset into it).
  bool is_pinned(const void* p) const;

 private:
  struct Cached {
    void* ptr;
    size_t size;
    cudaEvent_t ready;  // recorded at free; null when nothing was pending
  };
  mutable std::mutex mu_;
  std::map<const char*, size_t> live_;   // start -> rounded size, for is_pinned
  std::multimap<size_t, Cached> free_;   // by rounded size
  std::unordered_map<void*, size_t> requested_;
  MemoryStats stats_;
};

PinnedHostAllocator& pinned_allocator();
MemoryStats pinned_memory_stats();
bool is_pinned(const void* p);
// A CPU tensor in pinned memory (uninitialised), and a pinned copy of a CPU tensor.
Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
Tensor pin_memory(const Tensor& cpu_tensor);

// ---- the whole device's view, for tools
CacheStats cache_stats(int device);
void empty_cache(int device);  // all devices' caches when device < 0

}  // namespace weft::kernels::cuda
