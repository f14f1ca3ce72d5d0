// Tests for core: tensor geometry, views sharing storage, copies and dtype conversion,
// factories, the generator, memory counters and in-place storage free/re-allocate.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/device_runtime.h"
#include "core/element_search.h"
#include "core/fill_rule.h"
#include "core/stream.h"
#include "core/tensor.h"

using namespace weft;
using Catch::Contains;

TEST_CASE("contiguous tensors have row-major strides") {
  Tensor t = zeros({2, 3, 4});
  CHECK(t.shape() == Shape{2, 3, 4});
  CHECK(t.strides() == Shape{12, 4, 1});
  CHECK(t.numel() == 24);
  CHECK(t.is_contiguous());
  CHECK(t.dtype() == kFloat32);
  CHECK(t.device() == kCPU);
}

TEST_CASE("views share storage with their base") {
  Tensor t = arange(0, 12).view({3, 4});
  Tensor tr = t.transpose(0, 1);
  CHECK(tr.shape() == Shape{4, 3});
  CHECK(!tr.is_contiguous());
  CHECK(tr.storage() == t.storage());
  tr.select(0, 1).fill_(-1);  // column 1 of t
  CHECK(to_vector(t) == std::vector<double>{0, -1, 2, 3, 4, -1, 6, 7, 8, -1, 10, 11});
  CHECK(to_vector(t.narrow(1, 1, 2)) == std::vector<double>{-1, 2, -1, 6, -1, 10});
  CHECK(to_vector(t.slice(1, 0, 4, 2)) == std::vector<double>{0, 2, 4, 6, 8, 10});
  CHECK(to_vector(t.permute({1, 0}).contiguous()) == to_vector(tr));
  CHECK(to_vector(tr.contiguous()) == std::vector<double>{0, 4, 8, -1, -1, -1, 2, 6, 10, 3, 7, 11});
}

// Bounds whose sums would overflow int64 are checked without forming them.
TEST_CASE("narrow and slice take any int64 bounds without overflow") {
  Tensor t = from_vector({1, 2, 3, 4}, {4});
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_WITH(t.narrow(0, 2, kMax), Catch::Contains("narrow: 9223372036854775807 elements from 2 are out of bounds"));
  CHECK_THROWS_WITH(t.narrow(0, int64_t(1) << 62, int64_t(1) << 62), Catch::Contains("out of bounds for dim 0 of size 4"));
  CHECK(t.narrow(0, 4, 0).numel() == 0);
  Tensor one = t.slice(0, 1, 4, kMax);  // one element, t[1], as PyTorch's t[1:4:huge]
  REQUIRE(one.shape() == Shape{1});
  one.fill_(9);
  CHECK(to_vector(t) == std::vector<double>{1, 9, 3, 4});
  CHECK(t.slice(0, 3, 3, kMax).numel() == 0);
  CHECK(to_vector(t.slice(0, 0, 4, 3)) == std::vector<double>{1, 4});
}

TEST_CASE("reshape views when possible and copies otherwise") {
  Tensor t = arange(0, 6).view({2, 3});
  CHECK(t.reshape({3, 2}).storage() == t.storage());
  CHECK(t.reshape({-1}).shape() == Shape{6});
  Tensor tt = t.t();
  Tensor r = tt.reshape({6});
  CHECK(r.storage() != t.storage());
  CHECK(to_vector(r) == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK_THROWS_AS(tt.view({6}), Error);
  CHECK(t.flatten().shape() == Shape{6});
}

TEST_CASE("expand, squeeze, unsqueeze, chunk and split") {
  Tensor t = arange(0, 3).view({3, 1});
  Tensor e = t.expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(to_vector(e.select(0, 1).select(0, 2)) == std::vector<double>{2, 2, 2, 2});
  CHECK(t.squeeze().shape() == Shape{3});
  CHECK(t.squeeze(1).shape() == Shape{3});
  CHECK(t.unsqueeze(0).shape() == Shape{1, 3, 1});
  CHECK(t.unsqueeze(-1).shape() == Shape{3, 1, 1});
  auto chunks = arange(0, 10).chunk(4);  // torch.chunk: sizes 3, 3, 3, 1
  REQUIRE(chunks.size() == 4);
  CHECK(chunks[0].numel() == 3);
  CHECK(chunks[3].numel() == 1);
  CHECK(to_vector(chunks[3]) == std::vector<double>{9});
  auto parts = arange(0, 12).view({3, 4}).split(3, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].shape() == Shape{3, 1});
  CHECK(to_vector(parts[1]) == std::vector<double>{3, 7, 11});
  // A size-1 dim expands to any size but a negative one (-2 had made a tensor of -6 elements).
  CHECK_THROWS_WITH(ones({1, 3}).expand({-2, 3}), Contains("expand: cannot expand [1, 3] to [-2, 3] (dim 0: 1 vs -2)"));
}

TEST_CASE("a scalar written into an integer tensor must be a number the dtype holds") {
  // C++ leaves the conversion of NaN or 1e20 to an integer undefined (it had given -2^63 and INT_MIN).
  CHECK_THROWS_WITH(zeros({2}, {.dtype = kInt64}).fill_(NAN), Contains("fill_: i64[2] on cpu cannot hold nan"));
  CHECK_THROWS_WITH(full({2}, 1e20, {.dtype = kInt32}), Contains("cannot hold 1e+20"));
  CHECK_THROWS_WITH(full({2}, 256, {.dtype = DType::u8}), Contains("cannot hold 256"));
  CHECK_THROWS_WITH(from_vector({1, NAN}, {2}, {.dtype = kInt64}), Contains("factory: element 1 is nan, which i64 cannot hold"));
  CHECK(to_vector(full({2}, -2147483648.0, {.dtype = kInt32})) == std::vector<double>{-2147483648.0, -2147483648.0});
  CHECK(to_vector(full({1}, 255.9, {.dtype = DType::u8})) == std::vector<double>{255});
  CHECK(std::isnan(to_vector(full({1}, NAN)).front()));  // floats hold anything
}

TEST_CASE("a floating tensor cast to an integer dtype must hold only values that dtype can") {
  CHECK_THROWS_WITH(from_vector({1, 2, NAN}, {3}).to(kInt64), Contains("cast f32 -> i64: element 2 of f32[3] on cpu is nan"));
  CHECK_THROWS_WITH(from_vector({INFINITY}, {1}).to(kInt32), Contains("element 0 of f32[1] on cpu is inf, which i32 cannot"));
  CHECK_THROWS_WITH(from_vector({3e9}, {1}, {.dtype = DType::f64}).to(kInt32), Contains("is 3000000000, which i32"));
  CHECK_THROWS_WITH(from_vector({-1.0}, {1}).to(DType::bf16).to(DType::u8), Contains("cast bf16 -> u8: element 0"));
  Tensor dst = zeros({2}, {.dtype = kInt64});  // copy_ checks before it writes
  CHECK_THROWS_WITH(dst.copy_(from_vector({7, NAN}, {2})), Contains("element 1"));
  CHECK(to_vector(dst) == std::vector<double>{0, 0});
  CHECK(to_vector(from_vector({-2.7, 2147483647.0}, {2}, {.dtype = DType::f64}).to(kInt32)) ==
        std::vector<double>{-2, 2147483647});  // truncated toward zero, as C++ and torch do
  CHECK(to_vector(from_vector({NAN, 0}, {2}).to(DType::bool_)) == std::vector<double>{1, 0});  // NaN != 0: true
}

TEST_CASE("from_blob names a null pointer or a negative size") {
  float data[4] = {1, 2, 3, 4};
  CHECK(to_vector(from_blob(data, {2, 2}, kFloat32, kCPU)) == std::vector<double>{1, 2, 3, 4});
  CHECK_THROWS_WITH(from_blob(nullptr, {4}, kFloat32, kCPU), Contains("from_blob: null data for f32 [4]"));
  CHECK_THROWS_WITH(from_blob(data, {-4}, kFloat32, kCPU), Contains("from_blob: negative size in shape [-4]"));
  CHECK(from_blob(nullptr, {0}, kFloat32, kCPU).numel() == 0);
}

TEST_CASE("arange refuses a range that is not a finite count of elements") {
  CHECK(to_vector(arange(0, 3)) == std::vector<double>{0, 1, 2});
  CHECK(arange(2, 2).numel() == 0);
  for (double end : {-1.0, HUGE_VAL, 1e30, std::nan("")})  // inf had read "negative size in shape [-2^63]"
    CHECK_THROWS_WITH(arange(0, end), Contains("arange: range [0, ") && Contains("does not hold 0 to 2^62 elements"));
}

TEST_CASE("copy_ between overlapping views of one storage reads every element before writing") {
  Tensor t = arange(0, 9).view({3, 3});
  t.copy_(t.t());  // had given 0 3 6 3 4 7 6 7 8: rows written before they were read
  CHECK(to_vector(t) == std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8});
  Tensor u = arange(0, 6);
  u.narrow(0, 1, 5).copy_(u.narrow(0, 0, 5));  // a shift by one
  CHECK(to_vector(u) == std::vector<double>{0, 0, 1, 2, 3, 4});
  Tensor same = arange(0, 4);
  same.copy_(same);  // the same elements: nothing to do
  CHECK(to_vector(same) == std::vector<double>{0, 1, 2, 3});
  // Several elements of an expanded destination are one memory location: refused.
  CHECK_THROWS_WITH(zeros({1, 3}).expand({4, 3}).copy_(arange(0, 12).view({4, 3})),
                    Contains("copy_: f32[4, 3]") && Contains("is expanded (dim 0 has stride 0)"));
}

TEST_CASE("as_strided refuses a view past its storage, however large the strides") {
  CHECK(to_vector(arange(0, 6).as_strided({2, 2}, {3, 1}, 1)) == std::vector<double>{1, 2, 4, 5});
  CHECK_THROWS_WITH(arange(0, 6).as_strided({2, 2}, {3, 1}, 2), Contains("reaches past storage of 24 bytes"));
  // (size - 1) * stride and the byte count wrapped: the view passed and wrote before its storage.
  CHECK_THROWS_WITH(zeros({2}).as_strided({2}, {(int64_t(1) << 62) - 1}, 0), Contains("reaches past storage of 8 bytes"));
  CHECK_THROWS_WITH(zeros({2}).as_strided({2}, {INT64_MAX / 4 + 1}, 0), Contains("reaches past storage"));
  CHECK_THROWS_WITH(zeros({2}).as_strided({3, 2}, {INT64_MAX / 2, INT64_MAX / 2}, 0), Contains("reaches past storage"));
  CHECK(zeros({2}).as_strided({0, 5}, {INT64_MAX, INT64_MAX}, 0).numel() == 0);  // no element: any strides
}

TEST_CASE("dtype conversions round to nearest even") {
  // bf16 has 8 mantissa bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> rounds to even (1).
  CHECK(float(BFloat16(1.0f + 0x1p-8f)) == 1.0f);
  CHECK(float(BFloat16(1.0f + 3 * 0x1p-8f)) == 1.0f + 0x1p-6f);
  CHECK(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  // f16: 10 mantissa bits; 1 + 2^-11 ties to 1, 1 + 3*2^-11 ties up to 1 + 2^-9.
  CHECK(float(Half(1.0f + 0x1p-11f)) == 1.0f);
  CHECK(float(Half(1.0f + 3 * 0x1p-11f)) == 1.0f + 0x1p-9f);
  CHECK(float(Half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(float(Half(65520.0f))));
  CHECK(float(Half(0x1p-24f)) == 0x1p-24f);  // smallest subnormal
  CHECK(float(Half(0x1p-26f)) == 0.0f);
  Tensor x = from_vector({1.5, -2.25, 3.0, 1e-3}, {4});
  for (DType d : {kFloat64, kBFloat16, kFloat16}) {
    Tensor y = x.to(d).to(kFloat32);
    auto v = to_vector(y);
    CHECK(v[0] == 1.5);
    CHECK(v[1] == -2.25);
    CHECK(v[2] == 3.0);
    CHECK(std::abs(v[3] - 1e-3) < 1e-5);
  }
  CHECK(to_vector(from_vector({-1.7, 2.9}, {2}).to(kInt64)) == std::vector<double>{-1, 2});
  CHECK(to_vector(from_vector({0, 2}, {2}).to(kBool)) == std::vector<double>{0, 1});
}

TEST_CASE("factories and seeded generators") {
  CHECK(to_vector(full({2}, 7)) == std::vector<double>{7, 7});
  CHECK(to_vector(arange(1, 2, 0.25)) == std::vector<double>{1, 1.25, 1.5, 1.75});
  Generator g1(42), g2(42);
  CHECK(to_vector(randn({5}, {}, &g1)) == to_vector(randn({5}, {}, &g2)));
  Tensor u = rand({1000}, {}, &g1);
  for (double v : to_vector(u)) CHECK((v >= 0 && v < 1));
  Tensor n = randn({20000}, {.dtype = kFloat64}, &g1);
  auto v = to_vector(n);
  double mean = 0, sq = 0;
  for (double a : v) { mean += a; sq += a * a; }
  mean /= double(v.size());
  CHECK(std::abs(mean) < 0.03);
  CHECK(std::abs(sq / double(v.size()) - 1) < 0.05);
}

TEST_CASE("Philox4x32-10 matches the published known-answer vectors") {
  // Random123's kat_vectors for philox4x32_10 (counter, key -> output).
  using W = std::array<uint32_t, 4>;
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == W{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}) == W{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        W{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("a fill of n elements reserves n counters and element i draws from counter offset + i") {
  Generator g(7);
  Tensor a = rand({3, 5}, {.dtype = kFloat64}, &g);
  CHECK(g.offset() == 15);
  Tensor b = randn({4}, {.dtype = kFloat64}, &g);
  CHECK(g.offset() == 19);
  auto va = to_vector(a), vb = to_vector(b);
  for (int64_t i = 0; i < 15; ++i) CHECK(va[size_t(i)] == counter_uniform(7, uint64_t(i)));
  for (int64_t i = 0; i < 4; ++i) CHECK(vb[size_t(i)] == counter_normal(7, 15 + uint64_t(i)));
  // State is {seed, offset}: restoring it replays the same draws.
  auto st = g.state();
  double x = g.uniform();
  g.set_state(st);
  CHECK(g.uniform() == x);
  CHECK(g.offset() == 20);
  // A fill large enough to run on several threads gives each element its own counter's value.
  Tensor big = randn({256, 300}, {}, &g);
  auto vbig = to_vector(big);
  bool all_equal = true;
  for (int64_t i = 0; i < 256 * 300; ++i) all_equal &= vbig[size_t(i)] == double(float(counter_normal(7, 20 + uint64_t(i))));
  CHECK(all_equal);
  // A non-contiguous destination gets the values of its row-major order.
  Generator g1(3), g2(3);
  Tensor t = empty({4, 6}, {.dtype = kFloat64}).t();
  t.uniform_(-1, 2, &g1);
  Tensor ref = empty({6, 4}, {.dtype = kFloat64});
  ref.uniform_(-1, 2, &g2);
  CHECK(to_vector(t) == to_vector(ref));
}

TEST_CASE("any slice of a random fill equals the same slice of the whole fill") {
  for (DType dt : {kFloat32, kFloat64, kBFloat16})
    for (auto kind : {FillRule::Kind::uniform, FillRule::Kind::normal}) {
      INFO(dtype_name(dt) << (kind == FillRule::Kind::uniform ? " uniform" : " normal"));
      const Shape shape{7, 6, 5};
      Generator g(11);
      g.reserve(100);  // a fill that does not start at counter 0
      Tensor full = empty(shape, {.dtype = dt});
      const FillRule rule{.kind = kind, .a = -0.5, .b = 0.75, .seed = 11, .offset = 100};
      if (kind == FillRule::Kind::uniform) full.uniform_(-0.5, 0.75, &g);
      else full.normal_(-0.5, 0.75, &g);
      for (int64_t dim = 0; dim < 3; ++dim)
        for (auto [start, len] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {4, 1}, {0, 5}}) {
          INFO("dim " << dim << " start " << start << " length " << len);
          Tensor part = empty(full.narrow(dim, start, len).shape(), {.dtype = dt});
          fill_slice(part, rule, shape, dim, start);
          CHECK(to_vector(part) == to_vector(full.narrow(dim, start, len)));
        }
      // Into a non-contiguous destination (through a temporary).
      Tensor wide = zeros({5, 6, 7}, {.dtype = dt}).permute({2, 1, 0});
      fill_slice(wide, rule, shape);
      CHECK(to_vector(wide) == to_vector(full));
    }
  CHECK_THROWS_WITH(fill_slice(zeros({2, 3}), FillRule{}, {4, 4}, 0, 1), Catch::Contains("does not fit"));
  CHECK_THROWS_WITH(fill_slice(zeros({3, 4}), FillRule{}, {4, 4}, 0, 2), Catch::Contains("does not fit"));
}

TEST_CASE("the meta device: shapes and dtypes, no memory, fills recorded") {
  auto before = memory_stats().live_bytes;
  Generator g(5);
  Tensor w, c;
  {
    DefaultDeviceGuard meta(Device::meta());
    CHECK(default_device().is_meta());
    w = randn({64, 32}, {}, &g);
    c = full({8}, 2.5, {.dtype = kBFloat16});
    CHECK(empty({3}).device().is_meta());
    CHECK(empty({3}, {.device = kCPU}).device().is_cpu());
  }
  CHECK(default_device().is_cpu());
  CHECK(memory_stats().live_bytes == before);
  CHECK(w.device().is_meta());
  CHECK(w.device().str() == "meta");
  CHECK(w.str() == "tensor(..., f32[64, 32] on meta)");
  CHECK(g.offset() == 64 * 32);
  CHECK(recorded_fill(w)->kind == FillRule::Kind::normal);
  CHECK(recorded_fill(c)->a == 2.5);
  CHECK_THROWS_WITH(w.data_ptr(), Catch::Contains("meta device"));
  CHECK_THROWS_WITH(to_vector(w), Catch::Contains("meta device"));
  CHECK_THROWS_WITH(w.narrow(0, 0, 2).uniform_(), Catch::Contains("part of its storage"));
  Generator g2(5);
  CHECK(to_vector(materialize_tensor(w, kCPU)) == to_vector(randn({64, 32}, {}, &g2)));
  CHECK(to_vector(materialize_tensor(c, kCPU)) == std::vector<double>(8, 2.5));
  Tensor never = empty({2}, {.device = Device::meta()});
  CHECK(recorded_fill(never) == nullptr);
  materialize_in_place(never, kCPU);
  CHECK(to_vector(never) == std::vector<double>{0, 0});
  // A meta tensor converts to a meta tensor of the other dtype (a model converted before it is
  // loaded), unless a fill is recorded on it: rounded from the rule, its values would differ.
  Tensor unfilled = empty({2, 3}, {.device = Device::meta()}).to(kBFloat16);
  CHECK(unfilled.device().is_meta());
  CHECK(unfilled.dtype() == kBFloat16);
  CHECK(unfilled.shape() == Shape{2, 3});
  CHECK_THROWS_WITH(w.to(kBFloat16), Catch::Contains("records normal(") && Catch::Contains("after materialising it"));
  // Kind::none (values a load writes next) converts, still none, and materialises unwritten.
  Tensor to_load = empty({2, 3}, {.device = Device::meta()});
  to_load.storage()->set_deferred_fill(std::make_shared<const FillRule>(FillRule{.kind = FillRule::Kind::none}));
  REQUIRE(recorded_fill(to_load.to(kBFloat16)) != nullptr);
  CHECK(recorded_fill(to_load.to(kBFloat16))->kind == FillRule::Kind::none);
  Tensor written = full({2, 3}, 7.0);
  fill_slice(written, *recorded_fill(to_load), {2, 3});
  CHECK(to_vector(written) == std::vector<double>(6, 7.0));
}

TEST_CASE("memory counters count exact bytes and track the peak") {
  reset_peak_memory_stats();
  auto before = memory_stats();
  {
    Tensor a = empty({100}, {.dtype = kFloat32});     // 400 bytes
    Tensor b = empty({3, 5}, {.dtype = kBFloat16});   // 30 bytes
    auto mid = memory_stats();
    CHECK(mid.live_bytes - before.live_bytes == 430);
    CHECK(mid.peak_bytes >= before.live_bytes + 430);
  }
  auto after = memory_stats();
  CHECK(after.live_bytes == before.live_bytes);
  CHECK(after.peak_bytes - before.live_bytes == 430);
  reset_peak_memory_stats();
  CHECK(memory_stats().peak_bytes == memory_stats().live_bytes);
}

TEST_CASE("the memory timeline records every change while on, and nothing while off") {
  { Tensor unrecorded = empty({64}); }
  CHECK(stop_memory_recording().samples.empty());  // off by default
  reset_peak_memory_stats();
  const int64_t base = memory_stats().live_bytes;
  start_memory_recording();
  {
    Tensor a = empty({1000});  // 4000 bytes
    Tensor b = empty({500});   // 2000 bytes
    a = Tensor();
    Tensor c = empty({250});   // 1000 bytes
  }
  MemoryTimeline tl = stop_memory_recording();
  { Tensor after_stop = empty({64}); }
  REQUIRE(tl.samples.size() == 6);
  CHECK(tl.dropped == 0);
  std::vector<int64_t> live;
  for (auto& s : tl.samples) live.push_back(s.live_bytes - base);
  CHECK(live == std::vector<int64_t>{4000, 6000, 2000, 3000, 2000, 0});  // c, then b, go out of scope
  for (size_t i = 1; i < tl.samples.size(); ++i) CHECK(tl.samples[i].t_ns >= tl.samples[i - 1].t_ns);
  CHECK(memory_stats().peak_bytes - base == 6000);  // the largest sample is the peak

  start_memory_recording(Device::cpu(), 2);  // a full timeline counts what it could not keep
  { Tensor a = empty({8}), b = empty({8}); }
  tl = stop_memory_recording();
  CHECK(tl.samples.size() == 2);
  CHECK(tl.dropped == 2);
}

TEST_CASE("a memory limit turns an allocation past it into a named out-of-memory error") {
  const int64_t live = memory_stats().live_bytes;
  set_memory_limit(kCPU, live + (1 << 20));
  REQUIRE(memory_limit() == live + (1 << 20));
  std::string err;
  {
    const std::string owner = "the test's buffer";
    Tensor kept;
    {
      MemoryOwner owning(owner);
      kept = empty({512 << 10}, {.dtype = DType::u8});  // 0.5 MiB, under the limit
    }
    try {
      Tensor big = empty({1 << 20}, {.dtype = DType::u8});
    } catch (const OutOfMemoryError& e) {
      err = e.what();
    }
    CHECK(memory_stats().live_bytes == live + (512 << 10));  // the refused bytes are not counted
  }
  set_memory_limit(kCPU, 0);
  INFO(err);
  CHECK_THAT(err, Catch::Contains("out of memory on cpu: allocating 1.0 MiB (1048576 bytes)") &&
                      Catch::Contains("would pass the memory limit of") && Catch::Contains("WEFT_MEMORY_LIMIT") &&
                      Catch::Contains("Largest live allocations: 0.5 MiB the test's buffer"));
  CHECK(memory_stats().live_bytes == live);
  // No limit: the same allocation succeeds.
  CHECK_NOTHROW(empty({1 << 20}, {.dtype = DType::u8}));
  CHECK_THROWS_WITH(set_memory_limit(kCPU, -1), Catch::Contains("positive byte count"));
}

TEST_CASE("byte counts as WEFT_MEMORY_LIMIT takes them") {
  CHECK(parse_bytes("1000", "x") == 1000);
  CHECK(parse_bytes("512K", "x") == 512 << 10);
  CHECK(parse_bytes("3M", "x") == 3 << 20);
  CHECK(parse_bytes("2GiB", "x") == int64_t(2) << 30);
  CHECK(parse_bytes("1T", "x") == int64_t(1) << 40);
  // Every count up to 2^63-1 bytes, and none beyond.
  CHECK(parse_bytes("1000000000000000", "x") == int64_t(1000000000000000));
  CHECK(parse_bytes("9223372036854775807", "x") == std::numeric_limits<int64_t>::max());
  CHECK(parse_bytes("8388607T", "x") == int64_t(8388607) << 40);
  CHECK(parse_bytes("0009223372036854775807", "x") == std::numeric_limits<int64_t>::max());
  for (const char* big : {"9223372036854775808", "8388608T", "18446744073709551616"})
    CHECK_THROWS_WITH(parse_bytes(big, "x"), Catch::Contains("more than 2^63-1 bytes"));
  for (const char* bad : {"", "12X", "-5", "1.5G", "M", "99999999999999999999"})
    CHECK_THROWS_WITH(parse_bytes(bad, "WEFT_MEMORY_LIMIT"), Catch::Contains("WEFT_MEMORY_LIMIT: \"" + std::string(bad) + "\""));
}

TEST_CASE("the CPU allocator reuses freed blocks of a size class and gives them back on empty_cache") {
  if (!cpu_block_cache_enabled()) {
    WARN("skipped: the CPU block cache is off (WEFT_CPU_CACHE=0 or a sanitizer build)");
    return;
  }
  Allocator& cpu = allocator_for(kCPU);
  cpu.empty_cache();
  const auto before = memory_stats();
  void* first = nullptr;
  {
    Tensor t = empty({100000});  // 400,000 bytes: class 409,600
    first = t.data_ptr();
  }
  auto cached = memory_stats();
  CHECK(cached.live_bytes == before.live_bytes);
  CHECK(cached.reserved_bytes >= before.reserved_bytes + 409600);  // kept, not freed
  {
    Tensor t = empty({99000});  // 396,000 bytes: the same class
    CHECK(t.data_ptr() == first);
    CHECK(memory_stats().reserved_bytes == cached.reserved_bytes);
  }
  cpu.empty_cache();
  CHECK(memory_stats().reserved_bytes == before.reserved_bytes);
}

// Run in a child process with WEFT_CPU_CACHE=1M (the allocator reads it once per process), and without it, the
// limit lowered to 1 MiB by limit_cpu_block_cache (as a run planned near the memory it has does).
const char* const kCacheToPeak = "the CPU block cache keeps freed blocks past its size while the process stays under its peak";
TEST_CASE(kCacheToPeak, "[.]") {
  REQUIRE(limit_cpu_block_cache(1 << 20) == 1 << 20);
  CHECK(limit_cpu_block_cache(int64_t(1) << 40) == 1 << 20);  // never raised
  const int64_t mib8 = 8 << 20;
  auto reserved = [] { return memory_stats().reserved_bytes; };
  Tensor a = empty({mib8 / 4}), b = empty({mib8 / 4});
  const int64_t with_both = reserved();
  a = Tensor();  // 8 MiB past the 1 MiB cache, but live + cached stays at the peak: kept
  CHECK(reserved() == with_both);
  Tensor c = empty({mib8 / 4});  // and handed out again
  CHECK(reserved() == with_both);
  c = Tensor();
  b = Tensor();  // both kept: 16 MiB cached, nothing live
  CHECK(reserved() == with_both);
  Tensor big = empty({4 * mib8 / 4});  // 32 MiB: the peak is now 32 MiB (+ class rounding)
  const int64_t with_big = reserved();
  big = Tensor();  // 16 + 32 MiB would be past the peak's 36: given back
  CHECK(reserved() == with_big - 4 * mib8);
}

TEST_CASE("the CPU block cache grows to the peak of live bytes, not past it") {
  if (!cpu_block_cache_enabled()) {
    WARN("skipped: the CPU block cache is off (WEFT_CPU_CACHE=0 or a sanitizer build)");
    return;
  }
  for (const char* env : {"WEFT_CPU_CACHE=1M", "WEFT_CPU_CACHE="}) {
    std::string cmd = fmt::format("{} '{}' '{}' > /dev/null", env, std::filesystem::read_symlink("/proc/self/exe").string(),
                                  kCacheToPeak);
    INFO(cmd);
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("CPU blocks of 2 MiB and more start on a 2 MiB boundary, advised as transparent huge pages") {
  Tensor small = empty({1000});
  Tensor big = empty({1 << 20});  // 4 MiB
  CHECK(reinterpret_cast<uintptr_t>(big.data_ptr()) % (2 << 20) == 0);
  CHECK(reinterpret_cast<uintptr_t>(small.data_ptr()) % 64 == 0);
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    WARN("skipped the advice's check: this kernel has no transparent huge pages");
    return;
  }
  // The mapping that holds the block carries the advice: "hg" in its VmFlags (proc(5)).
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(big.data_ptr());
  bool inside = false, advised = false, found = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0) found = true, advised = line.find(" hg") != std::string::npos;
  }
  REQUIRE(found);
  CHECK(advised);
}

TEST_CASE("storage can be freed and re-allocated in place") {
  Tensor t = ones({256});
  Tensor v = t.narrow(0, 10, 5);
  auto live = memory_stats().live_bytes;
  t.storage()->free();
  CHECK(memory_stats().live_bytes == live - 1024);
  CHECK_THROWS_WITH(t.data_ptr(), Catch::Contains("freed"));
  CHECK_THROWS_AS(to_vector(v), Error);
  t.storage()->allocate(1024);
  CHECK(memory_stats().live_bytes == live);
  t.fill_(3);
  CHECK(to_vector(v) == std::vector<double>{3, 3, 3, 3, 3});
  // The views were made for 1024 bytes: another size is refused (64 bytes backed a 1 KiB view, whose writes ran
  // past them), and a size past any memory is an out-of-memory error, not an overflowed size class.
  t.storage()->free();
  CHECK_THROWS_WITH(t.storage()->allocate(64), Catch::Contains("64 bytes for a storage of 1024"));
  CHECK_THROWS_WITH(t.data_ptr(), Catch::Contains("freed"));
  Tensor w = arange(4);
  w.storage()->free();
  CHECK_THROWS_WITH(w.storage()->allocate(size_t(-1)), Catch::Contains("bytes for a storage of"));
  CHECK_THROWS_AS(StorageImpl(size_t(-1), kCPU), OutOfMemoryError);
}

// A tensor freed after the static destructors (as by a communication thread whose works are still in flight when the
// process exits) finds its allocator: this holder is made before the first tensor and so destroyed after every
// function-local static, the allocators' too (a destroyed allocator was a "pure virtual method called" abort).
struct FreedAtExit {
  Tensor t;
} g_freed_at_exit;

TEST_CASE("a tensor freed after the static destructors finds its allocator") {
  g_freed_at_exit.t = ones({1024});
  CHECK(g_freed_at_exit.t.storage()->is_allocated());
}

TEST_CASE("printing shows values, dtype and shape") {
  std::string s = from_vector({1, 2, 3, 4}, {2, 2}).str();
  CHECK(s.find("[[1.0, 2.0],") != std::string::npos);
  CHECK(s.find("f32[2, 2] on cpu") != std::string::npos);
  std::string big = zeros({100, 100}).str();
  CHECK(big.find("...") != std::string::npos);
}

TEST_CASE("streams and events: no-ops on the CPU, timing needs recorded device events") {
  Stream s = current_stream(kCPU);
  CHECK(s == Stream());
  CHECK(s.device() == kCPU);
  CHECK(s.query());
  {
    StreamGuard guard(Stream::create(kCPU));  // a CPU stream is the CPU stream
    CHECK(current_stream(kCPU) == Stream());
  }
  Event e(true), f(true);
  e.record(s);
  f.record(s);
  CHECK(e.query());
  CHECK_FALSE(e.recorded());
  e.synchronize();
  s.wait(e);
  synchronize(kCPU);
  CHECK_THROWS_WITH(e.elapsed_ms(f), Contains("must have been recorded on a device stream"));
  Event untimed;
  CHECK_THROWS_WITH(untimed.elapsed_ms(f), Contains("enable_timing"));
  CHECK(device_count(DeviceType::cpu) == 1);
  CHECK(device_description(kCPU) == "cpu");
}

TEST_CASE("find_nonfinite names the first NaN or infinity, in contiguous f32 and any other layout") {
  Tensor t = zeros({3, 1000});
  CHECK_FALSE(find_nonfinite(t).has_value());
  t.data<float>()[2500] = std::numeric_limits<float>::infinity();
  t.data<float>()[2999] = std::nanf("");
  REQUIRE(find_nonfinite(t).has_value());
  CHECK(find_nonfinite(t)->index == 2500);
  CHECK(find_nonfinite(t.transpose(0, 1))->index == 1502);  // element (500, 2) of the transpose
  CHECK(find_nonfinite(t.to(kFloat64))->index == 2500);
  t.data<float>()[2500] = 3.4e38f;  // the largest floats are finite
  CHECK(find_nonfinite(t)->index == 2999);
  CHECK(find_nonfinite(t.narrow(1, 0, 999).contiguous()) == std::nullopt);
  // 16-bit floats, past the blocks the bit scan splits a large tensor into (the last element
  // of one and of the whole tensor); the largest finite values are finite there too.
  for (DType d : {kBFloat16, kFloat16}) {
    Tensor h = full({300001}, d == kFloat16 ? 65504.0 : 3.0e38, {.dtype = d});
    CHECK_FALSE(find_nonfinite(h).has_value());
    for (int64_t at : {int64_t(16383), int64_t(300000)}) {
      Tensor bad = h.clone();
      bad.narrow(0, at, 1).fill_(at == 16383 ? std::numeric_limits<double>::quiet_NaN() : -INFINITY);
      REQUIRE(find_nonfinite(bad).has_value());
      CHECK(find_nonfinite(bad)->index == at);
    }
  }
}
