// Every collective of the MPI backend, for every dtype and for tiny, uneven and large sizes,
// against values each rank computes locally (rank r contributes value(r, i)); async overlap;
// the debug-mode mismatch report; bad input. Runs alone (world of 1) and under mpirun -np 2, 4.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "autograd/ops.h"
#include "dist/dist.h"

using namespace weft;
using namespace weft::dist;
using Catch::Contains;

namespace {

// Small integers: exact in every dtype, and so are their sums over 4 ranks and those sums
// divided by 1, 2 or 4, so results can be compared exactly.
double value(int rank, int64_t i) { return double((rank * 5 + i * 3) % 23 - 11); }

Tensor make(DType dtype, int64_t n, int rank, int64_t first = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, first + i);
  return from_vector(v, {n}, {.dtype = dtype});
}

// Compares in bulk: one CHECK per tensor, naming the first differing element.
void check_equal(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  std::vector<double> g = to_vector(got);
  REQUIRE(g.size() == want.size());
  int64_t bad = -1, n_bad = 0;
  for (size_t i = 0; i < g.size(); ++i)
    if (g[i] != want[i] && !(std::isnan(g[i]) && std::isnan(want[i]))) {
      if (bad < 0) bad = int64_t(i);
      ++n_bad;
    }
  INFO(what << " on rank " << rank() << ": " << n_bad << " elements differ"
            << (bad >= 0 ? ", first at " + std::to_string(bad) + ": got " + std::to_string(g[size_t(bad)]) +
                               ", want " + std::to_string(want[size_t(bad)])
                         : ""));
  CHECK(n_bad == 0);
}

double reduce(ReduceOp op, int64_t i, int p) {
  double acc = value(0, i);
  for (int r = 1; r < p; ++r) {
    double v = value(r, i);
    acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  return op == ReduceOp::avg ? acc / p : acc;
}

const std::vector<DType> kAllDtypes = {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64};
const std::vector<int64_t> kSizes = {0, 1, 3, 1000};
constexpr int64_t kLarge = 1000001;

std::string label(const char* op, DType t, int64_t n) {
  return std::string(op) + " " + std::string(dtype_name(t)) + " n=" + std::to_string(n);
}

}  // namespace

TEST_CASE("world group") {
  auto w = world();
  CHECK(w->size() == world_size());
  CHECK(w->rank() == rank());
  CHECK(w->backend() == "mpi");
  CHECK(w->world_ranks().size() == size_t(world_size()));
  CHECK(world() == w);
  CHECK_THROWS_WITH(world(DeviceType::meta), Contains("dist: group 'world' on meta: collectives run on CPU or CUDA"));
  CHECK(local_rank() >= 0);
  init();  // idempotent
  CHECK(is_initialized());
}

TEST_CASE("all_gather_into_tensor: every dtype and size, rank order") {
  auto g = world();
  int p = g->size();
  for (DType t : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64, kInt32, kUInt8}) {
    std::vector<int64_t> sizes = kSizes;
    if (t == kFloat32 || t == kBFloat16) sizes.push_back(kLarge);
    for (int64_t n : sizes) {
      // u8 holds no negative values (casting one is undefined): rank + 1 everywhere, 199 before.
      Tensor in = t == kUInt8 ? full({n}, double(g->rank() + 1), {.dtype = t}) : make(t, n, g->rank());
      Tensor out = full({p * n}, t == kUInt8 ? 199 : -99, {.dtype = t});
      g->all_gather_into_tensor(out, in)->wait();
      std::vector<double> want;
      for (int r = 0; r < p; ++r)
        for (int64_t i = 0; i < n; ++i) want.push_back(t == kUInt8 ? r + 1 : value(r, i));
      check_equal(out, want, label("all_gather", t, n));
    }
  }
}

TEST_CASE("all_gather_into_tensor in place: in is out's own slice") {
  auto g = world();
  int64_t n = 5;
  Tensor out = zeros({g->size() * n});
  Tensor in = out.narrow(0, g->rank() * n, n);
  in.copy_(make(kFloat32, n, g->rank()));
  g->all_gather_into_tensor(out, in)->wait();
  std::vector<double> want;
  for (int r = 0; r < g->size(); ++r)
    for (int64_t i = 0; i < n; ++i) want.push_back(value(r, i));
  check_equal(out, want, "in-place all_gather");
  // A 2-D out of shape [size, n] is fine too: only the element count matters.
  Tensor out2 = zeros({g->size(), n});
  g->all_gather_into_tensor(out2, make(kFloat32, n, g->rank()))->wait();
  check_equal(out2.flatten(), want, "all_gather into [size, n]");
}

TEST_CASE("reduce_scatter_tensor: sum, avg, max, min for every dtype and size") {
  auto g = world();
  int p = g->size(), me = g->rank();
  for (DType t : kAllDtypes) {
    std::vector<int64_t> sizes = kSizes;
    if (t == kFloat32 || t == kBFloat16) sizes.push_back(kLarge);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      if (op == ReduceOp::avg && t == kInt64) continue;
      for (int64_t m : sizes) {
        if (m == kLarge && (op == ReduceOp::max || op == ReduceOp::min)) continue;
        // Each rank contributes value(r, i) over the whole input of p * m elements.
        Tensor in = make(t, p * m, me);
        Tensor out = full({m}, -99, {.dtype = t});
        g->reduce_scatter_tensor(out, in, op)->wait();
        std::vector<double> want;
        for (int64_t i = 0; i < m; ++i) want.push_back(reduce(op, me * m + i, p));
        check_equal(out, want, label("reduce_scatter", t, m) + " " + std::string(reduce_op_name(op)));
      }
    }
  }
}

TEST_CASE("all_reduce: sum, avg, max, min for every dtype and size") {
  auto g = world();
  int p = g->size();
  for (DType t : kAllDtypes) {
    std::vector<int64_t> sizes = kSizes;
    if (t == kFloat32 || t == kBFloat16 || t == kInt64) sizes.push_back(kLarge);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      if (op == ReduceOp::avg && t == kInt64) continue;
      for (int64_t n : sizes) {
        Tensor x = make(t, n, g->rank());
        g->all_reduce(x, op)->wait();
        std::vector<double> want;
        for (int64_t i = 0; i < n; ++i) want.push_back(reduce(op, i, p));
        check_equal(x, want, label("all_reduce", t, n) + " " + std::string(reduce_op_name(op)));
      }
    }
  }
}

TEST_CASE("bf16 and f16 reductions accumulate in f32 and round once") {
  auto g = world();
  int p = g->size();
  // 1 + 2^-9 is not a bf16 (8 significant bits); p of them summed in bf16 step by step would
  // lose the small part each time, summed in f32 it survives until the final rounding.
  Tensor x = full({3}, g->rank() == 0 ? 1.0 : std::ldexp(1.0, -9), {.dtype = kBFloat16});
  g->all_reduce(x, ReduceOp::sum)->wait();
  float exact = 1.0f + float(p - 1) * std::ldexp(1.0f, -9);
  check_equal(x, std::vector<double>(3, double(float(BFloat16(exact)))), "bf16 sum rounding");
  // 40000 x p overflows f16 (max 65504) from 2 ranks on, but not f32: the average survives.
  Tensor h = full({3}, 40000.0, {.dtype = kFloat16});
  g->all_reduce(h, ReduceOp::avg)->wait();
  check_equal(h, std::vector<double>(3, 40000.0), "f16 avg");
}

TEST_CASE("broadcast from every root") {
  auto g = world();
  for (DType t : kAllDtypes) {
    for (int root = 0; root < g->size(); ++root) {
      for (int64_t n : {int64_t(1), int64_t(3), t == kFloat32 ? kLarge : int64_t(1000)}) {
        Tensor x = make(t, n, g->rank());
        g->broadcast(x, root)->wait();
        std::vector<double> want;
        for (int64_t i = 0; i < n; ++i) want.push_back(value(root, i));
        check_equal(x, want, label("broadcast", t, n) + " root " + std::to_string(root));
      }
    }
  }
}

TEST_CASE("all_to_all_single and barrier") {
  auto g = world();
  int p = g->size(), me = g->rank();
  int64_t block = 3;
  // Rank r sends block j (values 100 r + 10 j + k) to rank j.
  std::vector<double> v;
  for (int j = 0; j < p; ++j)
    for (int64_t k = 0; k < block; ++k) v.push_back(100 * me + 10 * j + double(k));
  Tensor in = from_vector(v, {p * block}, {.dtype = kFloat64});
  Tensor out = zeros({p * block}, {.dtype = kFloat64});
  g->all_to_all_single(out, in)->wait();
  std::vector<double> want;
  for (int i = 0; i < p; ++i)
    for (int64_t k = 0; k < block; ++k) want.push_back(100 * i + 10 * me + double(k));
  check_equal(out, want, "all_to_all_single");
  for (int k = 0; k < 3; ++k) g->barrier()->wait();
}

TEST_CASE("many collectives in flight complete in issue order with correct results") {
  auto g = world();
  int p = g->size();
  std::vector<WorkPtr> works;
  std::vector<Tensor> outs;
  for (int k = 0; k < 20; ++k) {
    Tensor in = make(kFloat32, 10 + k, g->rank(), k);
    outs.push_back(empty({p * (10 + k)}));
    works.push_back(g->all_gather_into_tensor(outs.back(), in));  // `in` is kept alive by the Work
  }
  for (int k = 19; k >= 0; --k) works[size_t(k)]->wait();  // waiting out of order is fine
  for (int k = 0; k < 20; ++k) {
    CHECK(works[size_t(k)]->is_completed());
    CHECK(works[size_t(k)]->info().kind == CollectiveKind::all_gather);
    std::vector<double> want;
    for (int r = 0; r < p; ++r)
      for (int64_t i = 0; i < 10 + k; ++i) want.push_back(value(r, k + i));
    check_equal(outs[size_t(k)], want, "queued all_gather " + std::to_string(k));
  }
  CHECK(works[1]->info().seq == works[0]->info().seq + 1);
}

TEST_CASE("async: the caller computes while a collective is in flight") {
  auto g = world();
  int p = g->size(), me = g->rank();
  int64_t n = 1 << 20;
  Tensor in = make(kFloat32, n, me), out = empty({p * n});
  Tensor a = rand({192, 192}), b = rand({192, 192});
  // The last rank joins only after every other rank has issued its all-gather, checked it, and
  // computed while it was pending, and said so with a file (outside MPI, so nothing else is in
  // flight on the group): their all-gather cannot complete before the last rank joins, whatever
  // the speed of the machine. The directory is named after rank 0's pid, agreed over the group.
  const bool late = me == p - 1 && p > 1;
  Tensor pid = scalar_tensor(me == 0 ? double(getpid()) : 0.0, {.dtype = kFloat64});
  g->all_reduce(pid, ReduceOp::sum)->wait();
  const std::filesystem::path sync =
      std::filesystem::temp_directory_path() / ("weft_async_" + std::to_string(int64_t(pid.item())));
  if (me == 0) std::filesystem::create_directories(sync);
  g->barrier()->wait();
  Tensor c;
  WorkPtr w;
  if (!late) {
    w = g->all_gather_into_tensor(out, in);
    if (p > 1) CHECK_FALSE(w->is_completed());
    for (int k = 0; k < 10; ++k) c = matmul(a, b);  // the caller's thread is free
    if (p > 1) CHECK_FALSE(w->is_completed());  // still waiting for the last rank
    std::ofstream(sync / std::to_string(me)) << "issued";
  } else {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int r = 0; r < p - 1; ++r)
      while (!std::filesystem::exists(sync / std::to_string(r))) {
        REQUIRE(std::chrono::steady_clock::now() < deadline);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    for (int k = 0; k < 10; ++k) c = matmul(a, b);
    w = g->all_gather_into_tensor(out, in);
  }
  w->wait();
  g->barrier()->wait();
  if (me == 0) std::filesystem::remove_all(sync);
  CHECK(w->is_completed());
  CHECK(c.size(0) == 192);
  std::vector<double> want;
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < n; ++i) want.push_back(value(r, i));
  check_equal(out, want, "overlapped all_gather");
}

// The issuing thread posts a call, but only the communication thread drives it while the
// caller does not wait: polling is_completed() alone must see it complete, with the values.
TEST_CASE("async: a collective the caller never waits for completes (the communication thread drives it)") {
  auto g = world();
  int p = g->size(), me = g->rank();
  int64_t n = 1 << 16;
  for (int round = 0; round < 3; ++round) {  // the second and third find the thread napping
    Tensor in = make(kFloat32, n, me, round), out = empty({p * n});
    WorkPtr w = g->all_gather_into_tensor(out, in);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!w->is_completed() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    INFO("round " << round);
    REQUIRE(w->is_completed());
    std::vector<double> want;
    for (int r = 0; r < p; ++r)
      for (int64_t i = 0; i < n; ++i) want.push_back(value(r, i + round));
    check_equal(out, want, "all_gather completed without wait()");
    w->wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 60));  // past the deep-sleep point
  }
}

TEST_CASE("debug mode: mismatched calls throw the same error on every rank, naming the ranks") {
  auto g = world();
  if (g->size() < 2) return;
  set_debug_mode(true);
  // The last rank passes a different size: every rank sees every rank's call and throws.
  int64_t n = g->rank() == g->size() - 1 ? 4 : 3;
  Tensor in = ones({n}), out = empty({g->size() * n});
  std::string last = "rank " + std::to_string(g->size() - 1);
  CHECK_THROWS_WITH(g->all_gather_into_tensor(out, in)->wait(),
                    Contains("WEFT_DIST_DEBUG") && Contains("rank 0 calls all_gather_into_tensor") &&
                        Contains(last + " calls all_gather_into_tensor") && Contains("in 4 elements") &&
                        Contains("in 3 elements"));
  // Different collectives (a barrier against an all_reduce) are caught the same way.
  Tensor x = ones({2});
  if (g->rank() == 0) CHECK_THROWS_WITH(g->barrier()->wait(), Contains("barrier") && Contains("all_reduce"));
  else CHECK_THROWS_WITH(g->all_reduce(x)->wait(), Contains("barrier") && Contains("all_reduce"));
  // Matching calls pass the check, and the group is still in step.
  Tensor y = ones({2});
  g->all_reduce(y)->wait();
  check_equal(y, std::vector<double>(2, double(g->size())), "all_reduce after the debug errors");
  set_debug_mode(false);
}

TEST_CASE("the always-on fingerprint check: mismatched calls throw on every rank before any buffer is touched") {
  auto g = world();
  if (g->size() < 2) return;
  REQUIRE_FALSE(debug_mode());
  // Sizes that differ would make MPI write past the smaller ranks' buffers: every rank throws
  // instead, and `out` keeps its values.
  int64_t n = g->rank() == g->size() - 1 ? 4 : 3;
  Tensor in = ones({n}), out = full({g->size() * n}, -7.0);
  std::string last = "rank " + std::to_string(g->size() - 1);
  CHECK_THROWS_WITH(g->all_gather_into_tensor(out, in)->wait(),
                    Contains("dist collective check:") && Contains("rank 0 calls all_gather_into_tensor") &&
                        Contains(last + " calls all_gather_into_tensor") && Contains("in 4 elements") &&
                        Contains("in 3 elements"));
  check_equal(out, std::vector<double>(size_t(g->size() * n), -7.0), "the all-gather's output after the check failed");
  // Same sizes, different labels (e.g. two FSDP modules of one shape): also caught.
  {
    CollectiveLabel label(g->rank() == 0 ? "module a" : "module b");
    Tensor x = ones({2});
    CHECK_THROWS_WITH(g->all_reduce(x)->wait(), Contains("[module a]") && Contains("[module b]"));
    check_equal(x, std::vector<double>(2, 1.0), "the all-reduce's tensor after the check failed");
  }
  if (g->size() > 1) {  // labels alike in their first 120 bytes (an FSDP module's path can be that long)
    std::string long_label(125, 'm');
    long_label.push_back(g->rank() == 0 ? 'a' : 'b');  // (not string + char*: gcc 12 warns falsely on that copy)
    CollectiveLabel label(long_label);
    Tensor x = ones({2});
    CHECK_THROWS_WITH(g->all_reduce(x)->wait(), Contains("issue different collectives"));  // had mixed the two
    check_equal(x, std::vector<double>(2, 1.0), "the all-reduce's tensor after the long labels' check failed");
  }
  // Matching calls pass, and the group is still in step.
  Tensor y = ones({2});
  auto work = g->all_reduce(y);
  for (double bad : {1e30, 0.0, -1.0, std::nan("")})  // 1e30 had put the deadline in the past: the job aborted
    CHECK_THROWS_WITH(work->wait(bad), Contains("Work::wait: a timeout of") && Contains("is not above 0 and at most 1e9"));
  work->wait();
  check_equal(y, std::vector<double>(2, double(g->size())), "all_reduce after the check errors");
}

TEST_CASE("bad input is a clear error naming the op and the tensors") {
  auto g = world();
  int p = g->size();
  uint64_t before = g->num_collectives();
  CHECK_THROWS_WITH(g->all_gather_into_tensor(zeros({p * 3 + 1}), zeros({3})),
                    Contains("all_gather_into_tensor") && Contains("out must hold") && Contains("f32[3]"));
  CHECK_THROWS_WITH(g->reduce_scatter_tensor(zeros({2}), zeros({p * 2 + 1})),
                    Contains("reduce_scatter_tensor") && Contains("in must hold"));
  CHECK_THROWS_WITH(g->all_gather_into_tensor(zeros({p * 3}, {.dtype = kFloat64}), zeros({3})),
                    Contains("dtype mismatch") && Contains("f64") && Contains("f32"));
  CHECK_THROWS_WITH(g->all_reduce(zeros({4, 3}).t()),
                    Contains("all_reduce") && Contains("not contiguous") && Contains("[3, 4]"));
  CHECK_THROWS_WITH(g->reduce_scatter_tensor(zeros({2}, {.dtype = kInt64}), zeros({p * 2}, {.dtype = kInt64}), ReduceOp::avg),
                    Contains("avg") && Contains("i64"));
  CHECK_THROWS_WITH(g->all_reduce(zeros({2}, {.dtype = kBool})), Contains("cannot reduce bool"));
  CHECK_THROWS_WITH(g->broadcast(zeros({2}), p), Contains("root"));
  CHECK_THROWS_WITH(g->all_reduce(Tensor()), Contains("undefined"));
  Tensor buf = zeros({p * 4});
  if (p > 1)
    CHECK_THROWS_WITH(g->all_gather_into_tensor(buf, buf.narrow(0, ((g->rank() + 1) % p) * 4, 4)),
                      Contains("overlap"));
  // A tensor labelled as CUDA memory: the device check comes before anything touches it.
  static float fake[4];
  Tensor cuda = from_blob(fake, {4}, kFloat32, Device::cuda(0));
  CHECK_THROWS_WITH(g->all_reduce(cuda), Contains("cuda:0") && Contains("MPI backend takes CPU tensors"));
  CHECK_THROWS_WITH(g->all_gather_into_tensor(zeros({p * 4}), cuda), Contains("in is f32[4] on cuda:0"));
  CHECK(g->num_collectives() == before);  // nothing was issued, so the ranks stay in step
  CHECK_THROWS_WITH(set_collective_timeout(-1), Contains("dist::set_collective_timeout: a timeout of -1 s is not above 0 and at most 1e9"));
  CHECK_THROWS_WITH(set_collective_timeout(1e10), Contains("at most 1e9"));  // past it the clock overflows
  if (!nccl_available()) CHECK_THROWS_WITH(world(DeviceType::cuda), Contains("without CUDA"));
  else if (cuda_device_count() == 0) CHECK_THROWS_WITH(world(DeviceType::cuda), Contains("no usable CUDA device"));
}
