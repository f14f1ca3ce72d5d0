#include "core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "core/error.h"

namespace weft {
namespace {

// 64-byte aligned host memory with atomic counters; OpenMP threads and the communication
// thread may allocate concurrently.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    WEFT_CHECK(p != nullptr, "cpu allocator: out of memory allocating {} bytes (live {} bytes)",
               nbytes, live_.load());
    int64_t live = live_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    total_.fetch_add(int64_t(nbytes));
    allocs_.fetch_add(1);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::free(ptr);
    live_.fetch_sub(int64_t(nbytes));
    frees_.fetch_add(1);
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.live_bytes = s.reserved_bytes = live_.load();
    s.peak_bytes = peak_.load();
    s.total_allocated_bytes = total_.load();
    s.num_allocs = allocs_.load();
    s.num_frees = frees_.load();
    return s;
  }
  void reset_peak() override { peak_.store(live_.load()); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, total_{0}, allocs_{0}, frees_{0};
};

Allocator* g_allocators[kNumDeviceTypes] = {nullptr, nullptr};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;  // never destroyed before static tensors that use it
    return cpu;
  }
  Allocator* a = g_allocators[int(device.type)];
  WEFT_CHECK(a != nullptr, "no allocator for device {}: weft was built without that backend",
             device.str());
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) { g_allocators[int(type)] = allocator; }

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

}  // namespace weft
