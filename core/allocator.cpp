#include "core/allocator.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>

#include "core/device_runtime.h"
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
    record_live(live);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    std::free(ptr);
    int64_t live = live_.fetch_sub(int64_t(nbytes)) - int64_t(nbytes);
    frees_.fetch_add(1);
    record_live(live);
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
AllocatorLookup g_lookups[kNumDeviceTypes] = {nullptr, nullptr};

}  // namespace

void Allocator::start_recording(size_t capacity) {
  std::lock_guard<std::mutex> lock(record_mutex_);
  timeline_ = MemoryTimeline{};
  timeline_.samples.reserve(capacity);  // no reallocation (and no pause) while recording
  capacity_ = capacity;
  recording_.store(true);
}

MemoryTimeline Allocator::stop_recording() {
  std::lock_guard<std::mutex> lock(record_mutex_);
  recording_.store(false);
  MemoryTimeline out = std::move(timeline_);
  timeline_ = MemoryTimeline{};
  return out;
}

void Allocator::record_slow(int64_t live_bytes) {
  std::lock_guard<std::mutex> lock(record_mutex_);
  if (!recording_.load(std::memory_order_relaxed)) return;  // stopped while this thread waited
  if (timeline_.samples.size() >= capacity_) {
    ++timeline_.dropped;
    return;
  }
  // The clock is read under the lock so that the samples' times never go backwards.
  const int64_t t = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count();
  timeline_.samples.push_back({t, live_bytes});
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;  // never destroyed before static tensors that use it
    return cpu;
  }
  // A backend in its own library registers its allocator when it is loaded.
  if (g_lookups[int(device.type)] == nullptr && g_allocators[int(device.type)] == nullptr) {
    WEFT_CHECK(load_backend(device.type), "{} device {} requested ({}), but {}", device_type_name(device.type),
               device.index, device.str(), backend_unavailable_reason(device.type));
  }
  if (AllocatorLookup lookup = g_lookups[int(device.type)]) return lookup(device.index);
  Allocator* a = g_allocators[int(device.type)];
  WEFT_CHECK(a != nullptr, "no allocator for device {}: its backend registered none", device.str());
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) { g_allocators[int(type)] = allocator; }
void register_allocator_lookup(DeviceType type, AllocatorLookup lookup) { g_lookups[int(type)] = lookup; }

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

void start_memory_recording(Device device, size_t capacity) { allocator_for(device).start_recording(capacity); }
MemoryTimeline stop_memory_recording(Device device) { return allocator_for(device).stop_recording(); }

}  // namespace weft
