// The CUDA backend's logic that runs without a GPU: the caching allocator's pooling and
// statistics (on host memory standing in for device memory), how element-wise operands are
// laid out for the kernels, and the errors a program gets when it asks for a CUDA device
// that is not there or a backend that was not built. GPU behaviour itself is covered by
// test_cuda_conformance, which skips without a device.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <set>

#include "core/allocator.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#if WEFT_WITH_CUDA
#include "cuda/allocator.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"
#endif

using namespace weft;
using Catch::Contains;

TEST_CASE("cuda: CPU work is unaffected by the CUDA backend being built or a GPU being absent") {
  Tensor a = ones({3, 4});
  Tensor b = kernels::binary(kernels::BinaryOp::add, a, a);
  CHECK(to_vector(b) == std::vector<double>(12, 2.0));
  CHECK(memory_stats(kCPU).live_bytes > 0);
}

#if !WEFT_WITH_CUDA

TEST_CASE("cuda: without a CUDA build, asking for a CUDA device says so") {
  CHECK_THROWS_WITH(empty({2}, {.device = Device::cuda(0)}),
                    Contains("CUDA device 0 requested") && Contains("built without CUDA"));
  CHECK_THROWS_WITH(ones({2}).to(Device::cuda(0)), Contains("built without CUDA"));
  CHECK_THROWS_WITH(memory_stats(Device::cuda(0)), Contains("built without CUDA"));
}

#else

namespace cu = weft::kernels::cuda;

namespace {

// Host memory standing in for device memory, with a capacity to provoke out-of-memory.
class HostSource final : public cu::MemorySource {
 public:
  explicit HostSource(size_t capacity = size_t(1) << 40) : capacity_(capacity) {}
  void* allocate(size_t n) override {
    if (used_ + n > capacity_) return nullptr;
    used_ += n;
    ++allocs;
    void* p = std::malloc(n);
    sizes_[p] = n;
    return p;
  }
  void free(void* p) override {
    used_ -= sizes_.at(p);
    sizes_.erase(p);
    ++frees;
    std::free(p);
  }
  uintptr_t current_stream() override { return stream; }
  std::string describe() override { return "; test source"; }

  uintptr_t stream = 0;
  int allocs = 0, frees = 0;

 private:
  size_t capacity_, used_ = 0;
  std::map<void*, size_t> sizes_;
};

struct Fixture {
  HostSource* src = new HostSource;  // owned by `alloc`
  cu::CachingAllocator alloc{std::unique_ptr<cu::MemorySource>(src), "test"};
};

constexpr size_t MiB = size_t(1) << 20;

}  // namespace

TEST_CASE("cuda allocator: sizes round to 512 B, small requests share 2 MiB segments") {
  CHECK(cu::CachingAllocator::round_size(1) == 512);
  CHECK(cu::CachingAllocator::round_size(512) == 512);
  CHECK(cu::CachingAllocator::round_size(513) == 1024);
  CHECK(cu::CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(cu::CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(cu::CachingAllocator::segment_size(MiB + 512) == 2 * MiB);
  CHECK(cu::CachingAllocator::segment_size(5 * MiB) == 6 * MiB);

  Fixture f;
  std::set<char*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.insert(static_cast<char*>(f.alloc.allocate(1000)));
  CHECK(ptrs.size() == 100);
  CHECK(f.src->allocs == 1);  // 100 x 1024 B fit in one 2 MiB segment
  CHECK(*ptrs.rbegin() - *ptrs.begin() == 99 * 1024);
  MemoryStats s = f.alloc.stats();
  CHECK(s.live_bytes == 100 * 1000);  // what was asked for, not the rounded sizes
  CHECK(s.reserved_bytes == int64_t(2 * MiB));
  CHECK(s.num_allocs == 100);
  CHECK(f.alloc.cache_stats().block_bytes == 100 * 1024);
  for (char* p : ptrs) f.alloc.deallocate(p, 1000);
  CHECK(f.alloc.stats().live_bytes == 0);
  CHECK(f.alloc.stats().num_frees == 100);
  CHECK(f.alloc.stats().reserved_bytes == int64_t(2 * MiB));  // cached, not returned
}

TEST_CASE("cuda allocator: freed blocks are reused across steps without new segments") {
  Fixture f;
  auto step = [&] {
    void* a = f.alloc.allocate(3 * MiB);
    void* b = f.alloc.allocate(40000);
    void* c = f.alloc.allocate(7 * MiB + 5);
    f.alloc.deallocate(b, 40000);
    f.alloc.deallocate(a, 3 * MiB);
    f.alloc.deallocate(c, 7 * MiB + 5);
  };
  step();
  int after_first = f.src->allocs;
  int64_t reserved = f.alloc.stats().reserved_bytes;
  for (int i = 0; i < 10; ++i) step();
  CHECK(f.src->allocs == after_first);
  CHECK(f.alloc.stats().reserved_bytes == reserved);
  CHECK(f.alloc.cache_stats().cache_hits >= 30);
  CHECK(f.alloc.stats().peak_bytes == int64_t(3 * MiB + 40000 + 7 * MiB + 5));
}

TEST_CASE("cuda allocator: best fit, splitting and merging within a segment") {
  Fixture f;
  char* a = static_cast<char*>(f.alloc.allocate(4096));
  char* b = static_cast<char*>(f.alloc.allocate(4096));
  char* c = static_cast<char*>(f.alloc.allocate(4096));
  CHECK(b == a + 4096);
  CHECK(c == b + 4096);
  f.alloc.deallocate(b, 4096);
  // A smaller request takes the hole left by b (best fit), not the segment's big tail.
  char* d = static_cast<char*>(f.alloc.allocate(1000));
  CHECK(d == b);
  f.alloc.deallocate(d, 1000);
  f.alloc.deallocate(a, 4096);
  f.alloc.deallocate(c, 4096);
  // Everything merged back into one free 2 MiB block: a 1 MiB request fits at the start.
  char* e = static_cast<char*>(f.alloc.allocate(MiB));
  CHECK(e == a);
  CHECK(f.src->allocs == 1);
  f.alloc.deallocate(e, MiB);
  f.alloc.empty_cache();
  CHECK(f.src->frees == 1);
  CHECK(f.alloc.stats().reserved_bytes == 0);
  CHECK(f.alloc.cache_stats().segments == 0);
}

TEST_CASE("cuda allocator: large segments split only big tails; empty_cache keeps used segments") {
  Fixture f;
  void* a = f.alloc.allocate(5 * MiB);  // 6 MiB segment; the 1 MiB tail is not worth a block
  CHECK(f.alloc.cache_stats().block_bytes == int64_t(6 * MiB));  // not split
  f.alloc.deallocate(a, 5 * MiB);
  void* b = f.alloc.allocate(2 * MiB);  // reuses the 6 MiB block, splitting off 4 MiB
  CHECK(b == a);
  CHECK(f.alloc.cache_stats().block_bytes == int64_t(2 * MiB));
  void* c = f.alloc.allocate(3 * MiB);  // fits in the 4 MiB tail
  CHECK(static_cast<char*>(c) == static_cast<char*>(a) + 2 * MiB);
  CHECK(f.src->allocs == 1);
  f.alloc.empty_cache();  // the segment is in use: nothing to release
  CHECK(f.src->frees == 0);
  f.alloc.deallocate(b, 2 * MiB);
  f.alloc.deallocate(c, 3 * MiB);
  f.alloc.empty_cache();
  CHECK(f.src->frees == 1);
}

TEST_CASE("cuda allocator: blocks are reused only on the stream they were allocated on") {
  Fixture f;
  f.src->stream = 1;
  void* a = f.alloc.allocate(8192);
  f.alloc.deallocate(a, 8192);
  f.src->stream = 2;
  void* b = f.alloc.allocate(8192);
  CHECK(f.src->allocs == 2);  // stream 2 may not take stream 1's free memory
  f.src->stream = 1;
  void* c = f.alloc.allocate(8192);
  CHECK(c == a);
  f.alloc.deallocate(b, 8192);
  f.alloc.deallocate(c, 8192);
}

TEST_CASE("cuda allocator: peak reset, zero-size requests, bad frees, out of memory") {
  auto* src = new HostSource(8 * MiB);
  cu::CachingAllocator alloc(std::unique_ptr<cu::MemorySource>(src), "cuda:test");
  CHECK(alloc.allocate(0) == nullptr);
  void* a = alloc.allocate(MiB);
  void* b = alloc.allocate(MiB);
  alloc.deallocate(b, MiB);
  CHECK(alloc.stats().peak_bytes == int64_t(2 * MiB));
  alloc.reset_peak();
  CHECK(alloc.stats().peak_bytes == int64_t(MiB));
  CHECK_THROWS_WITH(alloc.deallocate(b, MiB), Contains("did not allocate"));
  int x = 0;
  CHECK_THROWS_WITH(alloc.deallocate(&x, 4), Contains("did not allocate"));

  // 2 MiB small segment in use + a cached free 4 MiB large segment; a 5 MiB request only fits
  // once the cache is emptied, and it is, automatically.
  void* c = alloc.allocate(3 * MiB + 1);
  alloc.deallocate(c, 3 * MiB + 1);
  void* d = alloc.allocate(5 * MiB);
  CHECK(alloc.cache_stats().oom_retries == 1);
  CHECK_THROWS_WITH(alloc.allocate(7 * MiB), Contains("CUDA out of memory on cuda:test") && Contains("test source"));
  alloc.deallocate(d, 5 * MiB);
  alloc.deallocate(a, MiB);
}

TEST_CASE("cuda: element-wise operands are planned with merged dims and broadcast strides") {
  // The planner reads only geometry: CPU tensors show it without a GPU.
  Tensor a = zeros({4, 5, 6});
  std::vector<cu::Operand> ops;
  cu::Geometry g = cu::plan(a.shape(), {&a, &a}, ops);
  CHECK(g.contiguous);
  CHECK(g.ndim == 1);
  CHECK(g.numel == 120);

  Tensor plain = a.select(0, 0);  // [5, 6], contiguous
  Tensor t = zeros({6, 5}).t();   // [5, 6] transposed
  Tensor row = zeros({6}).expand({5, 6});
  g = cu::plan({5, 6}, {&plain, &t, &row}, ops);
  CHECK_FALSE(g.contiguous);
  CHECK(g.ndim == 2);
  CHECK(ops[1].strides[0] == 1);
  CHECK(ops[1].strides[1] == 5);
  CHECK(ops[2].strides[0] == 0);
  CHECK(ops[2].strides[1] == 1);

  Tensor s = zeros({1, 1});
  g = cu::plan(s.shape(), {&s}, ops);
  CHECK(g.ndim == 0);
  CHECK(g.contiguous);
}

TEST_CASE("cuda: without a device, CUDA requests fail with the reason; with one, bad indices do") {
  if (cu::is_available()) {
    INFO("a CUDA device is visible: " << cu::device_description(0));
    CHECK_THROWS_WITH(empty({2}, {.device = Device::cuda(cu::device_count())}), Contains("device(s) are visible"));
    return;
  }
  CHECK(cu::device_count() == 0);
  CHECK_FALSE(cu::unavailable_reason().empty());
  CHECK_THROWS_WITH(empty({2}, {.device = Device::cuda(0)}),
                    Contains("CUDA device 0 requested (cuda:0), but no CUDA device is visible"));
  CHECK_THROWS_WITH(ones({2}).to(Device::cuda(0)), Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(memory_stats(Device::cuda(0)), Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(current_stream(Device::cuda(0)), Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(cu::empty_pinned({4}), Contains("no CUDA device is visible"));
  CHECK_THROWS_WITH(Stream::create(Device::cuda(0)), Contains("no CUDA device is visible"));
  // An event never recorded is complete; recording needs a device.
  Event e;
  CHECK(e.query());
  CHECK_THROWS_WITH(e.record(Stream::default_stream(Device::cuda(0))), Contains("no CUDA device is visible"));
  // The CPU's streams and events need no device.
  CHECK(current_stream(kCPU) == Stream());
  e.record(current_stream(kCPU));
  CHECK(e.query());
}

#endif
