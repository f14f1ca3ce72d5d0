// The NCCL backend on CUDA tensors: every collective against locally computed values, a
// mesh on cuda, and the device checks. Needs one GPU per rank (WEFT_TEST_GPUS, see
// dist_test_main.cpp); skips with the reason otherwise.
#include <catch2/catch.hpp>

#include "dist/device_mesh.h"
#include "dist/dist.h"

#ifdef WEFT_WITH_NCCL
#include <cuda_runtime.h>

using namespace weft;
using namespace weft::dist;
using Catch::Contains;

namespace {

double value(int rank, int64_t i) { return double((rank * 5 + i * 3) % 23 - 11); }

// A CUDA tensor holding `host` (converted to dtype), on the group's device.
Tensor to_gpu(const Tensor& host, Device device) {
  Tensor h = host.contiguous();
  void* p = nullptr;
  cudaSetDevice(device.index);
  REQUIRE(cudaMalloc(&p, std::max<size_t>(h.nbytes(), 1)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, h.data_ptr(), h.nbytes(), cudaMemcpyHostToDevice) == cudaSuccess);
  return from_blob(p, h.shape(), h.dtype(), device, [](void* q) { cudaFree(q); });
}

Tensor to_host(const Tensor& d) {
  Tensor h = empty(d.shape(), {.dtype = d.dtype()});
  REQUIRE(cudaMemcpy(h.data_ptr(), d.data_ptr(), d.nbytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

// One CHECK per comparison, naming the op and the first differing element.
void check_same(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  size_t bad = got.size(), n_bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) n_bad++, bad = std::min(bad, i);
  INFO(what << ": " << n_bad << " elements differ"
            << (n_bad ? ", first at " + std::to_string(bad) + ": got " + std::to_string(got[bad]) + ", want " +
                            std::to_string(want[bad])
                      : ""));
  CHECK(n_bad == 0);
}

Tensor make(DType t, int64_t n, int rank) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = value(rank, i);
  return from_vector(v, {n}, {.dtype = t});
}

}  // namespace

TEST_CASE("nccl: all_gather, reduce_scatter, all_reduce, broadcast, all_to_all, barrier") {
  auto g = world(DeviceType::cuda);
  CHECK(g->backend() == "nccl");
  CHECK(g->device().is_cuda());
  int p = g->size(), me = g->rank();
  Device dev = g->device();
  for (DType t : {kFloat32, kFloat64, kBFloat16, kFloat16, kInt64}) {
    for (int64_t n : {int64_t(1), int64_t(3), int64_t(100003)}) {
      INFO(dtype_name(t) << " n=" << n);
      Tensor out = to_gpu(zeros({p * n}, {.dtype = t}), dev);
      g->all_gather_into_tensor(out, to_gpu(make(t, n, me), dev))->wait();
      std::vector<double> got = to_vector(to_host(out)), want;
      for (int r = 0; r < p; ++r)
        for (int64_t i = 0; i < n; ++i) want.push_back(value(r, i));
      check_same(got, want, "all_gather");

      Tensor x = to_gpu(make(t, n, me), dev);
      g->all_reduce(x, ReduceOp::sum)->wait();
      got = to_vector(to_host(x));
      want.clear();
      for (int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (int r = 0; r < p; ++r) s += value(r, i);
        want.push_back(s);
      }
      check_same(got, want, "all_reduce");

      Tensor part = to_gpu(zeros({n}, {.dtype = t}), dev);
      ReduceOp op = is_floating(t) ? ReduceOp::avg : ReduceOp::sum;
      g->reduce_scatter_tensor(part, to_gpu(make(t, p * n, me), dev), op)->wait();
      got = to_vector(to_host(part));
      want.clear();
      for (int64_t i = 0; i < n; ++i) {
        double s = 0;
        for (int r = 0; r < p; ++r) s += value(r, me * n + i);
        want.push_back(op == ReduceOp::avg ? s / p : s);
      }
      check_same(got, want, "reduce_scatter");

      Tensor b = to_gpu(make(t, n, me), dev);
      g->broadcast(b, p - 1)->wait();
      check_same(to_vector(to_host(b)), to_vector(make(t, n, p - 1)), "broadcast");
    }
  }
  Tensor in = to_gpu(full({p * 2}, double(me)), dev), out = to_gpu(zeros({p * 2}), dev);
  g->all_to_all_single(out, in)->wait();
  std::vector<double> want;
  for (int r = 0; r < p; ++r) want.insert(want.end(), 2, double(r));
  CHECK(to_vector(to_host(out)) == want);
  auto w = g->barrier();
  w->wait();
  CHECK(w->is_completed());
}

TEST_CASE("nccl: CPU tensors are refused, meshes on cuda work") {
  auto g = world(DeviceType::cuda);
  CHECK_THROWS_WITH(g->all_reduce(zeros({2})), Contains("on cpu") && Contains("cuda:"));
  DeviceMesh mesh(DeviceType::cuda, {1, world_size()}, {"replicate", "shard"});
  CHECK(mesh.group("shard")->backend() == "nccl");
  Tensor x = to_gpu(ones({4}), mesh.group("shard")->device());
  mesh.group("shard")->all_reduce(x)->wait();
  CHECK(to_vector(to_host(x)) == std::vector<double>(4, double(world_size())));
}
#endif
