// cuda/: the caching device allocator and the pinned host allocator (allocator.h).
#include "cuda/allocator.h"

#include <array>
#include <atomic>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/runtime.h"

namespace weft::kernels::cuda {
namespace {

// Segments straight from cudaMalloc on one device.
class DeviceMemory final : public MemorySource {
 public:
  explicit DeviceMemory(int device) : device_(device) {}
  void* allocate(size_t nbytes) override {
    DeviceGuard g(device_);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, nbytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // the caller retries or reports; do not leave the error pending
      return nullptr;
    }
    WEFT_CUDA_CHECK(e);
    return p;
  }
  void free(void* p) override {
    DeviceGuard g(device_);
    WEFT_CUDA_CHECK(cudaFree(p));  // waits for the device: no kernel still uses the segment
  }
  uintptr_t current_stream() override { return reinterpret_cast<uintptr_t>(cuda::current_stream(device_)); }
  std::string describe() override {
    DeviceGuard g(device_);
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
      cudaGetLastError();
      return "";
    }
    return fmt::format("; the device has {} free of {}", format_mib(int64_t(free_b)), format_mib(int64_t(total)));
  }

 private:
  int device_;
};

}  // namespace

// ---------------------------------------------------------------- CachingAllocator

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
}

CachingAllocator::CachingAllocator(std::unique_ptr<MemorySource> source, std::string name)
    : source_(std::move(source)), name_(std::move(name)) {
  apply_env_limit();
}

CachingAllocator::~CachingAllocator() {
  // Only tests destroy allocators (device ones live for the whole process); give back what
  // the pools hold and forget blocks still handed out.
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments();
  for (auto& [p, b] : allocated_) delete b;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kRound) return kRound;
  return (nbytes + kRound - 1) / kRound * kRound;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallRequest) return kSmallSegment;
  return (rounded + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  return allocate(nbytes, source_->current_stream());
}

void* CachingAllocator::allocate(size_t nbytes, uintptr_t stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  check_limit(nbytes, stats_.live_bytes, name_);
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallRequest;
  Pool& pool = pool_of(small);

  // Best fit: the set is ordered by (stream, size, address), so the first block at or after
  // (stream, size) is the smallest that fits if it is still on this stream.
  Block key;
  key.stream = stream;
  key.size = size;
  Block* b = nullptr;
  auto it = pool.lower_bound(&key);
  if (it != pool.end() && (*it)->stream == stream) {
    b = *it;
    pool.erase(it);
    ++cache_.cache_hits;
  } else {
    size_t seg = segment_size(size);
    void* p = source_->allocate(seg);
    if (!p) {
      ++cache_.oom_retries;
      release_free_segments();
      p = source_->allocate(seg);
    }
    if (!p)
      throw OutOfMemoryError(fmt::format("CUDA out of memory on {}: tried to allocate {} ({} bytes); weft holds {} live and {} reserved "
                 "(of which {} cached){}", name_, format_mib(int64_t(nbytes)), nbytes, format_mib(stats_.live_bytes),
                 format_mib(stats_.reserved_bytes), format_mib(stats_.reserved_bytes - cache_.block_bytes), source_->describe()));
    b = new Block;
    b->ptr = static_cast<char*>(p);
    b->size = seg;
    b->stream = stream;
    b->small = small;
    stats_.reserved_bytes += int64_t(seg);
    cache_.peak_reserved_bytes = std::max(cache_.peak_reserved_bytes, stats_.reserved_bytes);
    ++cache_.segments;
    ++cache_.segment_allocs;
  }

  // Split off the tail when it is worth keeping: any 512 B in the small pool; in the large
  // pool only more than a small request, so large segments are not chopped into crumbs.
  size_t rest = b->size - size;
  if (small ? rest >= kRound : rest > kSmallRequest) {
    Block* r = new Block;
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = stream;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    pool.insert(r);
  }
  b->allocated = true;
  b->requested = nbytes;
  allocated_[b->ptr] = b;

  stats_.live_bytes += int64_t(nbytes);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  stats_.total_allocated_bytes += int64_t(nbytes);
  ++stats_.num_allocs;
  cache_.block_bytes += int64_t(b->size);
  track(b->ptr, nbytes);
  record_live(stats_.live_bytes);
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  WEFT_CHECK(it != allocated_.end(), "{} allocator: freeing {} which it did not allocate (or freed twice)", name_, ptr);
  untrack(ptr);
  Block* b = it->second;
  allocated_.erase(it);
  stats_.live_bytes -= int64_t(b->requested);
  ++stats_.num_frees;
  cache_.block_bytes -= int64_t(b->size);
  b->allocated = false;
  b->requested = 0;

  Pool& pool = pool_of(b->small);
  // Merge with free neighbours (same segment, hence same stream); take them out of the pool
  // before their size changes, since the pool is ordered by size.
  if (Block* p = b->prev; p && !p->allocated) {
    pool.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next) b->next->prev = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; n && !n->allocated) {
    pool.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }
  pool.insert(b);
  record_live(stats_.live_bytes);
}

void CachingAllocator::release_free_segments() {
  for (Pool* pool : {&small_free_, &large_free_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev || b->next) {  // part of a segment still partly in use
        ++it;
        continue;
      }
      it = pool->erase(it);
      source_->free(b->ptr);
      stats_.reserved_bytes -= int64_t(b->size);
      --cache_.segments;
      ++cache_.segment_frees;
      delete b;
    }
  }
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.live_bytes;
  cache_.peak_reserved_bytes = stats_.reserved_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_free_segments();
}

CacheStats CachingAllocator::cache_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_;
}

// ---------------------------------------------------------------- per device

namespace {
constexpr int kMaxDevices = 64;
std::array<std::atomic<CachingAllocator*>, kMaxDevices> g_device_allocators{};
std::mutex g_device_allocators_mu;
}  // namespace

CachingAllocator& device_allocator(int index) {
  check_device(index);
  WEFT_CHECK(index < kMaxDevices, "cuda: device index {} is beyond the {} devices weft supports", index, kMaxDevices);
  if (CachingAllocator* a = g_device_allocators[size_t(index)].load(std::memory_order_acquire)) return *a;
  std::lock_guard<std::mutex> lock(g_device_allocators_mu);
  CachingAllocator* a = g_device_allocators[size_t(index)].load();
  if (!a) {
    // Never destroyed: tensors in static storage may be freed after main returns, and
    // cudaFree at exit would race the runtime's own teardown.
    a = new CachingAllocator(std::make_unique<DeviceMemory>(index), "cuda:" + std::to_string(index));
    g_device_allocators[size_t(index)].store(a, std::memory_order_release);
  }
  return *a;
}

CacheStats cache_stats(int device) { return device_allocator(device).cache_stats(); }

void empty_cache(int device) {
  if (device >= 0) return device_allocator(device).empty_cache();
  for (auto& slot : g_device_allocators)
    if (CachingAllocator* a = slot.load()) a->empty_cache();
}

// ---------------------------------------------------------------- pinned host memory

namespace {
size_t pinned_round(size_t n) {
  size_t r = 512;
  while (r < n) r <<= 1;
  return r;
}
}  // namespace

void* PinnedHostAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  size_t size = pinned_round(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto [lo, hi] = free_.equal_range(size);
  for (auto it = lo; it != hi; ++it) {
    Cached& c = it->second;
    if (c.ready) {
      cudaError_t e = cudaEventQuery(c.ready);
      if (e == cudaErrorNotReady) continue;  // an async copy may still read it
      WEFT_CUDA_CHECK(e);
      WEFT_CUDA_CHECK(cudaEventDestroy(c.ready));
    }
    p = c.ptr;
    free_.erase(it);
    break;
  }
  if (!p) {
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocDefault);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      WEFT_ERROR("pinned host memory: out of memory allocating {} bytes ({} live, {} reserved)", nbytes,
                 stats_.live_bytes, stats_.reserved_bytes);
    }
    WEFT_CUDA_CHECK(e);
    stats_.reserved_bytes += int64_t(size);
  }
  live_[static_cast<const char*>(p)] = size;
  requested_[p] = nbytes;
  stats_.live_bytes += int64_t(nbytes);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  stats_.total_allocated_bytes += int64_t(nbytes);
  ++stats_.num_allocs;
  return p;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(static_cast<const char*>(ptr));
  WEFT_CHECK(it != live_.end(), "pinned host allocator: freeing {} which it did not allocate", ptr);
  size_t size = it->second;
  live_.erase(it);
  stats_.live_bytes -= int64_t(requested_[ptr]);
  requested_.erase(ptr);
  ++stats_.num_frees;
  // Mark the point after which no copy queued so far can read the block. Copies are issued
  // on the current stream of the device they involve; that of the current device is used.
  // This runs in tensor destructors, so it must not throw: if the event cannot be made, wait
  // for the device instead.
  cudaEvent_t ev = nullptr;
  int device = 0;
  bool ok = cudaGetDevice(&device) == cudaSuccess && cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess;
  if (ok) ok = cudaEventRecord(ev, current_stream(device)) == cudaSuccess;
  if (!ok) {
    cudaGetLastError();
    if (ev) cudaEventDestroy(ev);
    ev = nullptr;
    cudaDeviceSynchronize();
  }
  free_.emplace(size, Cached{ptr, size, ev});
}

MemoryStats PinnedHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void PinnedHostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.live_bytes;
}

void PinnedHostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, c] : free_) {
    if (c.ready) {
      WEFT_CUDA_CHECK(cudaEventSynchronize(c.ready));
      WEFT_CUDA_CHECK(cudaEventDestroy(c.ready));
    }
    WEFT_CUDA_CHECK(cudaFreeHost(c.ptr));
    stats_.reserved_bytes -= int64_t(size);
  }
  free_.clear();
}

bool PinnedHostAllocator::is_pinned(const void* p) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(c);
  if (it == live_.begin()) return false;
  --it;
  return c < it->first + it->second;
}

PinnedHostAllocator& pinned_allocator() {
  static PinnedHostAllocator* a = new PinnedHostAllocator;  // never destroyed, as device allocators
  return *a;
}

MemoryStats pinned_memory_stats() { return pinned_allocator().stats(); }
bool is_pinned(const void* p) { return pinned_allocator().is_pinned(p); }

Tensor empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t s : shape) WEFT_CHECK(s >= 0, "empty_pinned: negative size in shape {}", shape_str(shape));
  check_device(0);  // pinned memory needs the driver; say so plainly when there is none
  size_t nbytes = size_t(shape_numel(shape)) * dtype_size(dtype);
  void* p = pinned_allocator().allocate(nbytes);
  return from_blob(p, shape, dtype, Device::cpu(), [nbytes](void* q) { pinned_allocator().deallocate(q, nbytes); });
}

Tensor pin_memory(const Tensor& t) {
  WEFT_CHECK(t.defined() && t.device().is_cpu(), "pin_memory: expects a defined CPU tensor, got {}",
             t.defined() ? tensor_desc(t) : std::string("an undefined tensor"));
  Tensor out = empty_pinned(t.shape(), t.dtype());
  out.copy_(t.detach());
  return out;
}

}  // namespace weft::kernels::cuda
