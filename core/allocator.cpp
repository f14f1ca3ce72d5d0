#include "core/allocator.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>

#include <sys/mman.h>
#include <unistd.h>

#include "core/device_runtime.h"
#include "core/error.h"
#include "core/sanitizers.h"

namespace weft {
namespace {

#if defined(WEFT_ASAN) || defined(WEFT_TSAN)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Host memory, 64-byte aligned, with a cache of freed blocks. Freed blocks are kept by size class (64 B steps up to 4
// KiB, then steps of an eighth of the power of two below the size, so at most 1/8 is wasted) and handed out again for
// the next request of their class: a training step allocates the same sizes every time, and reusing them spares the
// page faults of memory that malloc returned to the system (large blocks are mmap'd and unmapped on every free). The
// cache holds WEFT_CPU_CACHE bytes (default an eighth of physical memory, >= 1 GiB; 0: off, as in sanitizer builds),
// and more while live + cached bytes stay within the peak of live ones (a step's transients). empty_cache() empties it.
// Counters: live and peak count the bytes asked for, as before; reserved counts what the allocator holds from the
// system (the classes of the live blocks plus the cache). OpenMP threads and the communication thread may allocate
// concurrently.
class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    apply_env_limit();
    cache_limit_ = kSanitized ? 0 : std::max<int64_t>(1 << 30, ::sysconf(_SC_PHYS_PAGES) * ::sysconf(_SC_PAGE_SIZE) / 8);
    if (const char* v = std::getenv("WEFT_CPU_CACHE"); v && *v && !kSanitized)
      cache_limit_ = parse_bytes(v, "WEFT_CPU_CACHE");
  }
  ~CpuAllocator() override { empty_cache(); }

  static size_t size_class(size_t n) {
    if (n <= 4096) return (n + 63) / 64 * 64;
    const int shift = std::bit_width(n - 1) - 4;  // eighths of the power of two at or above n
    const size_t step = size_t(1) << shift;
    return (n + step - 1) / step * step;
  }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const int64_t n = int64_t(nbytes);
    int64_t live;
    if (limit() > 0) {  // reserve the bytes first, so that concurrent allocations cannot pass the limit together
      int64_t cur = live_.load();
      do check_limit(nbytes, cur, "cpu");
      while (!live_.compare_exchange_weak(cur, cur + n));
      live = cur + n;
    } else {
      live = live_.fetch_add(n) + n;
    }
    const size_t cls = size_class(nbytes);
    void* p = take_cached(cls);
    if (p == nullptr) {
      p = system_alloc(cls);
      if (p == nullptr) {  // give the cache back to the system and try once more
        empty_cache();
        p = system_alloc(cls);
      }
      if (p == nullptr) {
        live_.fetch_sub(n);
        throw OutOfMemoryError(fmt::format("cpu allocator: out of memory allocating {} bytes (live {} bytes)", nbytes,
                                           live_.load()));
      }
      reserved_.fetch_add(int64_t(cls));
    }
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    total_.fetch_add(n);
    allocs_.fetch_add(1);
    track(p, nbytes);
    record_live(live);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    untrack(ptr);
    const size_t cls = size_class(nbytes);
    const int64_t live = live_.fetch_sub(int64_t(nbytes)) - int64_t(nbytes);
    if (!put_cached(ptr, cls, (peak_.load() - live) / 8 * 9)) {
      std::free(ptr);
      reserved_.fetch_sub(int64_t(cls));
    }
    frees_.fetch_add(1);
    record_live(live);
  }
  void empty_cache() override {
    std::lock_guard<std::mutex> lock(cache_mu_);
    for (auto& [cls, blocks] : cache_) {
      for (void* p : blocks) std::free(p);
      reserved_.fetch_sub(int64_t(cls * blocks.size()));
    }
    cache_.clear();
    cached_bytes_ = 0;
  }
  MemoryStats stats() const override {
    return {live_.load(), peak_.load(), reserved_.load(), total_.load(), allocs_.load(), frees_.load()};
  }
  void reset_peak() override { peak_.store(live_.load()); }
  bool caching() const { return cache_limit_ > 0; }
  int64_t keep_cache_within(int64_t bytes) {  // never to 0, which would turn caching off
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_limit_ > 0) cache_limit_ = std::clamp<int64_t>(bytes, 1, cache_limit_);
    return cache_limit_;
  }

 private:
  // Blocks of 2 MiB and more start on a 2 MiB boundary, and their whole 2 MiB pieces are advised as transparent huge
  // pages (Linux with THP "madvise" or "always"): one page fault per 2 MiB instead of 512 (a 1B model's load:
  // docs/PERFORMANCE.md). The tail past the last whole piece keeps 4 KiB pages, so no more memory is touched than asked
  // for. A kernel without THP refuses the advice (EINVAL): the block is used as it is.
  static constexpr size_t kHugePage = size_t(2) << 20;
  static void* system_alloc(size_t cls) {
    if (cls < kHugePage) return std::aligned_alloc(64, cls);
    void* p = nullptr;  // (aligned_alloc wants the size a multiple of the alignment)
    if (::posix_memalign(&p, kHugePage, cls) != 0) return nullptr;
    (void)::madvise(p, cls / kHugePage * kHugePage, MADV_HUGEPAGE);
    return p;
  }
  void* take_cached(size_t cls) {
    if (cache_limit_ == 0) return nullptr;
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(cls);
    if (it == cache_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= int64_t(cls);
    return p;
  }
  bool put_cached(void* p, size_t cls, int64_t to_peak) {
    if (cache_limit_ == 0) return false;
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cached_bytes_ + int64_t(cls) > std::max(cache_limit_.load(), to_peak)) return false;
    cache_[cls].push_back(p);
    cached_bytes_ += int64_t(cls);
    return true;
  }

  std::atomic<int64_t> live_{0}, peak_{0}, total_{0}, allocs_{0}, frees_{0}, reserved_{0};
  std::atomic<int64_t> cache_limit_{0};
  std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;  // free blocks by size class
  int64_t cached_bytes_ = 0;
};

// The meta device's: counts bytes as the CPU allocator does and returns disjoint addresses
// that nothing reads (meta storage has no data), so live and peak bytes of a computation on
// meta tensors are what it would take on a real device.
class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const int64_t live = live_.fetch_add(int64_t(nbytes)) + int64_t(nbytes);
    int64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    total_.fetch_add(int64_t(nbytes));
    allocs_.fetch_add(1);
    record_live(live);
    // Addresses as far apart as the bytes, so that overlap checks see distinct allocations apart.
    void* p = reinterpret_cast<void*>(next_.fetch_add((nbytes + 63) / 64 * 64));
    track(p, nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (!ptr) return;
    untrack(ptr);
    record_live(live_.fetch_sub(int64_t(nbytes)) - int64_t(nbytes));
    frees_.fetch_add(1);
  }
  MemoryStats stats() const override {
    const int64_t live = live_.load();  // reserved: the same
    return {live, peak_.load(), live, total_.load(), allocs_.load(), frees_.load()};
  }
  void reset_peak() override { peak_.store(live_.load()); }

 private:
  std::atomic<int64_t> live_{0}, peak_{0}, total_{0}, allocs_{0}, frees_{0};
  std::atomic<uintptr_t> next_{uintptr_t(1) << 12};
};

Allocator* g_allocators[kNumDeviceTypes] = {nullptr, nullptr};
std::atomic<bool> g_any_limit{false};
std::atomic<int> g_accountings{0};  // owner accountings running
thread_local const std::string* t_owner = nullptr;

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

// ---------------------------------------------------------------- memory limit

std::string format_mib(int64_t bytes) { return fmt::format("{:.1f} MiB", double(bytes) / double(1 << 20)); }

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  static const std::map<std::string, int> shifts = {{"", 0},   {"K", 10},   {"M", 20},   {"G", 30},   {"T", 40},
                                                    {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
  auto it = shifts.find(unit);
  WEFT_CHECK(i > 0 && it != shifts.end(),
             "{}: \"{}\" is not a byte count (digits, then optionally K, M, G, T or KiB, MiB, GiB, TiB; e.g. 512M)",
             what, text);
  // Up to 2^63-1 bytes: the digits are summed with an overflow check, then the unit's shift.
  const int64_t max = std::numeric_limits<int64_t>::max() >> it->second;
  int64_t n = 0;
  for (size_t k = 0; k < i; ++k) {
    const int d = text[k] - '0';
    WEFT_CHECK(n <= (max - d) / 10, "{}: \"{}\" is more than 2^63-1 bytes", what, text);
    n = n * 10 + d;
  }
  return n << it->second;
}

void Allocator::set_limit(int64_t bytes) {
  WEFT_CHECK(bytes >= 0, "set_memory_limit: the limit must be 0 (none) or a positive byte count, got {}", bytes);
  limit_.store(bytes);
  if (bytes > 0) {
    tracking_.store(true);
    g_any_limit.store(true);
  }
}

void Allocator::apply_env_limit() {
  if (const char* v = std::getenv("WEFT_MEMORY_LIMIT"); v && *v) set_limit(parse_bytes(v, "WEFT_MEMORY_LIMIT"));
}

void Allocator::label(void* ptr, std::string owner) {
  if (!ptr || !tracking_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(owners_mutex_);
  auto it = owners_.find(ptr);
  if (it == owners_.end()) return;
  if (it->second.accounted) {
    accounted_live_[it->second.owner] -= it->second.bytes;
    accounted_live_[owner] += it->second.bytes;
  }
  it->second.owner = std::move(owner);
}

void Allocator::track_slow(void* ptr, size_t nbytes) {
  const std::string* owner = MemoryOwner::current();
  std::lock_guard<std::mutex> lock(owners_mutex_);
  const bool accounted = accounting_.load(std::memory_order_relaxed);
  Owned& o = owners_[ptr] = {int64_t(nbytes), owner ? *owner : std::string(), accounted};
  if (!accounted) return;
  accounted_live_[o.owner] += o.bytes;
  accounted_total_ += o.bytes;
  if (accounted_total_ > accounted_peak_.peak_bytes)
    accounted_peak_ = {accounted_total_, o.owner, accounted_live_};
}

void Allocator::untrack_slow(void* ptr) {
  std::lock_guard<std::mutex> lock(owners_mutex_);
  auto it = owners_.find(ptr);
  if (it == owners_.end()) return;
  if (it->second.accounted) {
    accounted_live_[it->second.owner] -= it->second.bytes;
    accounted_total_ -= it->second.bytes;
  }
  owners_.erase(it);
}

void Allocator::start_accounting() {
  std::lock_guard<std::mutex> lock(owners_mutex_);
  for (auto& [p, o] : owners_) o.accounted = false;
  accounted_live_.clear();
  accounted_total_ = 0;
  accounted_peak_ = {};
  if (!accounting_.exchange(true)) g_accountings.fetch_add(1);
  tracking_.store(true);
}

void Allocator::reset_accounting_peak() {
  std::lock_guard<std::mutex> lock(owners_mutex_);
  accounted_peak_ = {accounted_total_, MemoryOwner::current() ? *MemoryOwner::current() : "", accounted_live_};
}

OwnerPeak Allocator::stop_accounting() {
  std::lock_guard<std::mutex> lock(owners_mutex_);
  if (accounting_.exchange(false)) g_accountings.fetch_sub(1);
  for (auto& [p, o] : owners_) o.accounted = false;
  OwnerPeak out = std::move(accounted_peak_);
  std::erase_if(out.by_owner, [](const auto& kv) { return kv.second == 0; });
  accounted_live_.clear();
  accounted_total_ = 0;
  accounted_peak_ = {};
  return out;
}

void Allocator::check_limit(size_t nbytes, int64_t live_bytes, const std::string& name) {
  const int64_t lim = limit();
  if (lim <= 0 || live_bytes + int64_t(nbytes) <= lim) return;
  // The largest owners of live memory, summed per owner.
  std::map<std::string, int64_t> by_owner;
  int64_t named = 0;
  {
    std::lock_guard<std::mutex> lock(owners_mutex_);
    for (auto& [p, o] : owners_)
      if (!o.owner.empty()) by_owner[o.owner] += o.bytes, named += o.bytes;
  }
  std::vector<std::pair<int64_t, std::string>> largest;
  for (auto& [owner, bytes] : by_owner) largest.emplace_back(bytes, owner);
  std::sort(largest.rbegin(), largest.rend());
  std::string owners;
  for (size_t i = 0; i < std::min<size_t>(largest.size(), 6); ++i)
    owners += fmt::format("{}{} {}", i ? ", " : "", format_mib(largest[i].first), largest[i].second);
  if (live_bytes > named) owners += fmt::format("{}{} not named", owners.empty() ? "" : ", ", format_mib(live_bytes - named));
  const std::string* owner = MemoryOwner::current();
  throw OutOfMemoryError(fmt::format(
      "out of memory on {}: allocating {} ({} bytes){} with {} live would pass the memory limit of {} ({} bytes; "
      "WEFT_MEMORY_LIMIT or weft::set_memory_limit). Largest live allocations: {}",
      name, format_mib(int64_t(nbytes)), nbytes, owner ? " for " + *owner : "", format_mib(live_bytes), format_mib(lim), lim,
      owners.empty() ? "none" : owners));
}

MemoryOwner::MemoryOwner(const std::string& owner) : previous_(t_owner) { t_owner = &owner; }
MemoryOwner::~MemoryOwner() { t_owner = previous_; }
const std::string* MemoryOwner::current() { return t_owner; }
bool MemoryOwner::wanted() {
  return g_any_limit.load(std::memory_order_relaxed) || g_accountings.load(std::memory_order_relaxed) > 0;
}

void set_memory_limit(Device device, int64_t bytes) { allocator_for(device).set_limit(bytes); }
int64_t memory_limit(Device device) { return allocator_for(device).limit(); }

// ---------------------------------------------------------------- registry

Allocator& allocator_for(Device device) {
  // Never destroyed: tensors freed after the static destructors (a static tensor's, a communication
  // thread's works still in flight when the process exits) still find their allocator.
  static Allocator* const cpu = new CpuAllocator, * const meta = new MetaAllocator;
  if (device.is_cpu()) return *cpu;
  if (device.is_meta()) return *meta;
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

bool cpu_block_cache_enabled() { return static_cast<CpuAllocator&>(allocator_for(Device::cpu())).caching(); }
int64_t limit_cpu_block_cache(int64_t bytes) {
  return static_cast<CpuAllocator&>(allocator_for(Device::cpu())).keep_cache_within(bytes);
}
MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }
void reset_peak_memory_stats(Device device) { allocator_for(device).reset_peak(); }

void start_owner_accounting(Device device) { allocator_for(device).start_accounting(); }
void reset_owner_accounting_peak(Device device) { allocator_for(device).reset_accounting_peak(); }
OwnerPeak stop_owner_accounting(Device device) { return allocator_for(device).stop_accounting(); }
void start_memory_recording(Device device, size_t capacity) { allocator_for(device).start_recording(capacity); }
MemoryTimeline stop_memory_recording(Device device) { return allocator_for(device).stop_recording(); }

}  // namespace weft
