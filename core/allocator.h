// core: per-device allocators and the memory counters FSDP's tests and benchmarks read.
// Counters track the bytes callers asked for (exact, no rounding), like
// torch.cuda.memory_stats' "allocated_bytes"; `reserved_bytes` is what the allocator holds
// from the system (equal to live bytes on CPU; a caching CUDA allocator holds more).
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/device.h"

namespace weft {

struct MemoryStats {
  int64_t live_bytes = 0;       // currently allocated
  int64_t peak_bytes = 0;       // highest live_bytes since start or the last reset
  int64_t reserved_bytes = 0;   // held from the system (CPU: same as live)
  int64_t total_allocated_bytes = 0;  // sum over all allocations
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void empty_cache() {}
};

// The allocator for a device; throws if that device's backend is not built or registered.
Allocator& allocator_for(Device device);
// Backends (e.g. kernels/cuda) install their allocator here at start-up.
void register_allocator(DeviceType type, Allocator* allocator);

MemoryStats memory_stats(Device device = Device::cpu());
void reset_peak_memory_stats(Device device = Device::cpu());

}  // namespace weft
