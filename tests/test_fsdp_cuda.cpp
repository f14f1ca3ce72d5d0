// FSDP on CUDA through NCCL: training with fully_shard on this rank's GPU gives the losses and
// parameters of plain training on the GPU (and of the CPU reference, within the two backends'
// rounding differences), with and without CPU offload; the default mesh is NCCL for CUDA
// modules, and a mesh whose backend cannot take the module's tensors is a clear error.
// Registered with WEFT_TEST_GPUS=1: without a CUDA build or a visible GPU, dist_test_main.cpp
// prints why and exits 77 (SKIP).
#include <catch2/catch.hpp>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "fsdp/state.h"
#include "weft.h"
#include "fsdp_test_models.h"

#include "core/device_runtime.h"
#include "core/stream.h"

using namespace weft;
using namespace weft::fsdp_test;
using Catch::Contains;

namespace {

Device gpu() { return dist::world(DeviceType::cuda)->device(); }

Batch on(const Batch& b, Device d) { return {b.x.to(d), b.y.to(d)}; }

std::vector<double> host_values(const Tensor& t) { return to_vector(t.to(kCPU)); }

// Trains the seeded UnevenMLP three ways for `steps` AdamW steps on the same global batches:
// on the CPU, on the GPU without FSDP, and on the GPU with fully_shard per layer plus the root
// (each rank its slice). FSDP must match the GPU run to fp32 parity and the CPU run within the
// difference between cuBLAS and Eigen products.
void run_cuda_parity(const fsdp::FullyShardOptions& opts, bool offload, int steps = 6) {
  const Device dev = gpu();
  manual_seed(7);
  auto cpu_ref = std::make_shared<UnevenMLP>();
  manual_seed(7);
  auto gpu_ref = std::make_shared<UnevenMLP>();
  gpu_ref->to(dev);
  manual_seed(7);
  auto model = std::make_shared<UnevenMLP>();
  model->to(dev);
  fsdp::fully_shard(model->fc1, opts);
  fsdp::fully_shard(model->fc2, opts);
  auto root = fsdp::fully_shard(model, opts);
  CHECK(root.state()->mesh->group(0)->backend() == "nccl");
  for (auto& p : model->parameters()) {
    if (offload) {
      CHECK(p.device().is_cpu());
      if (p.numel() > 0) CHECK(is_pinned(p.data_ptr(), gpu()));
    } else {
      CHECK(p.device() == dev);
    }
  }
  nn::AdamW cpu_opt(cpu_ref->parameters(), {.lr = 1e-2});
  nn::AdamW gpu_opt(gpu_ref->parameters(), {.lr = 1e-2});
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  for (int step = 0; step < steps; ++step) {
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
    opt.zero_grad();
    Batch global = mlp_batch(step, 8);
    Tensor l_cpu = loss_of(*cpu_ref, global);
    l_cpu.backward();
    Tensor l_gpu = loss_of(*gpu_ref, on(global, dev));
    l_gpu.backward();
    Tensor l = loss_of(*model, on(slice(global), dev));
    l.backward();
    if (offload)  // the sharded gradients arrive on the host, where the optimizer steps
      for (auto& p : model->parameters())
        if (p.grad().defined()) CHECK(p.grad().device().is_cpu());
    cpu_opt.step();
    gpu_opt.step();
    opt.step();
    double loss = global_mean(l.item());
    check_close({loss}, {l_gpu.item()}, 1e-5, fmt::format("loss at step {} (FSDP vs GPU)", step));
    check_close({loss}, {l_cpu.item()}, 1e-4, fmt::format("loss at step {} (FSDP vs CPU)", step));
  }
  for (auto& [name, p] : gpu_ref->named_parameters()) {
    std::vector<double> got = host_values(root.full_tensor(name));
    check_close(got, host_values(p), 1e-5, "parameter " + name + " (FSDP vs GPU)");
  }
  for (auto& [name, p] : cpu_ref->named_parameters())
    check_close(host_values(root.full_tensor(name)), host_values(p), 1e-4, "parameter " + name + " (FSDP vs CPU)",
                1e-5);
}

}  // namespace

TEST_CASE("fsdp on cuda: parity with GPU and CPU training, NCCL by default") {
  for (bool reshard : {true, false}) {
    INFO("reshard_after_forward " << reshard);
    run_cuda_parity({.reshard_after_forward = reshard}, false);
  }
}

TEST_CASE("fsdp on cuda: CPU offload keeps shards, gradients and the optimizer on pinned host memory") {
  run_cuda_parity({.offload_policy = fsdp::CPUOffloadPolicy{}}, true);
}

TEST_CASE("fsdp on cuda: collective counts and memory released after a step") {
  const Device dev = gpu();
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  m->to(dev);
  fsdp::fully_shard(m->fc1);
  fsdp::fully_shard(m->fc2);
  auto root = fsdp::fully_shard(m);
  for (int step = 0; step < 2; ++step) {
    auto before = root.comm_stats();
    Tensor l = loss_of(*m, on(slice(mlp_batch(step, 8)), dev));
    // fc1 and fc2: the root holds no parameters of its own, so it has no group to gather.
    CHECK(root.comm_stats().all_gathers - before.all_gathers == 2);
    l.backward();
    CHECK(root.comm_stats().reduce_scatters - before.reduce_scatters == 2);
  }
  synchronize(gpu());
  for (auto& p : m->parameters()) CHECK(p.device() == dev);
}

// The optimizer steps on a side stream behind a long queue of unrelated work; only the
// post-optimizer event orders the next forward's all-gathers after the step. Without it the
// gathers would read the shards before the step and the losses would lag the reference's.
// The gradients are zeroed in place on the side stream after the step: freeing them on the host
// (zero_grad's default) would hand their memory back to the main stream's pool while the queued
// step still reads it, and the next backward could write there first.
TEST_CASE("fsdp on cuda: set_post_optim_event orders the next all-gathers after a side-stream step") {
  const Device dev = gpu();
  manual_seed(7);
  auto ref = std::make_shared<UnevenMLP>();
  ref->to(dev);
  manual_seed(7);
  auto model = std::make_shared<UnevenMLP>();
  model->to(dev);
  fsdp::fully_shard(model->fc1);
  fsdp::fully_shard(model->fc2);
  auto root = fsdp::fully_shard(model);
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2});
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  Stream side = Stream::create(dev);
  Tensor busy = randn({2048, 2048}).to(dev);
  for (int step = 0; step < 4; ++step) {
    Batch global = mlp_batch(step, 8);
    ref_opt.zero_grad();
    Tensor l_ref = loss_of(*ref, on(global, dev));
    l_ref.backward();
    ref_opt.step();
    Tensor l = loss_of(*model, on(slice(global), dev));
    l.backward();
    check_close({global_mean(l.item())}, {l_ref.item()}, 1e-5, fmt::format("loss at step {}", step));
    Event grads_ready;
    grads_ready.record(current_stream(dev));
    side.wait(grads_ready);
    Event stepped;
    {
      StreamGuard on_side(side);
      Tensor x = busy;
      for (int i = 0; i < 40; ++i) x = matmul(x, busy) * 1e-3;
      NoGradGuard no_grad;
      opt.step();
      opt.zero_grad(false);
      stepped.record(side);
    }
    root.set_post_optim_event(std::move(stepped));
  }
  synchronize(dev);
}

TEST_CASE("fsdp on cuda: a mesh whose backend cannot take the module's tensors is an error") {
  const Device dev = gpu();
  auto cpu_mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cpu);
  auto cuda_mesh = std::make_shared<dist::DeviceMesh>(DeviceType::cuda);
  auto on_gpu = std::make_shared<UnevenMLP>();
  on_gpu->to(dev);
  CHECK_THROWS_WITH(fsdp::fully_shard(on_gpu->fc1, {.mesh = cpu_mesh}),
                    Contains("on " + dev.str()) && Contains("mpi backend") && Contains("DeviceMesh(DeviceType::cuda)"));
  auto on_cpu = std::make_shared<UnevenMLP>();
  CHECK_THROWS_WITH(fsdp::fully_shard(on_cpu->fc1, {.mesh = cuda_mesh}),
                    Contains("on cpu") && Contains("nccl backend") && Contains("move the module to"));
}

TEST_CASE("fsdp on cuda: SummonFullParams(offload_to_cpu) gives host full tensors, else device ones") {
  // The CPU suites cannot see this option (a CPU group's full tensors are host tensors anyway).
  const Device dev = gpu();
  for (bool offload : {false, true}) {
    INFO("offload_to_cpu = " << offload);
    manual_seed(7);
    auto ref = std::make_shared<UnevenMLP>();
    manual_seed(7);
    auto model = std::make_shared<UnevenMLP>();
    model->to(dev);
    fsdp::fully_shard(model->fc1);
    auto root = fsdp::fully_shard(model);
    fsdp::SummonFullParams full(root, {.offload_to_cpu = offload});
    const Tensor w = model->fc1->weight;
    CHECK(w.shape() == ref->fc1->weight.shape());
    CHECK(w.device() == (offload ? kCPU : dev));
    CHECK(host_values(w) == to_vector(ref->fc1->weight));
  }
}
