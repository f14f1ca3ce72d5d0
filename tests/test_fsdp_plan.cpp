// The memory planner (run at 1, 2 and 4 ranks): fsdp::plan_memory's predicted peak for the
// app's GPT trained with FSDP is within 5 % of the CPU allocator's peak when this rank really
// trains it (in f32, and in bf16 both ways: FSDP's MixedPrecisionPolicy and autocast); its shards part is exactly the shard bytes fully_shard allocates; and with a
// budget between the smallest and the largest plan, the settings it chooses fit and training
// with them stays under the budget, while a budget below the smallest plan is refused.
#include <algorithm>
#include <cstdio>

#include "apps/transformer/gpt.h"
#include "core/allocator.h"
#include "dist/fake_group.h"
#include "fsdp/fsdp.h"
#include "fsdp_test_models.h"

using namespace weft;

namespace {

const apps::ModelConfig kConfig{.vocab_size = 64, .ctx = 16, .n_layer = 4, .n_head = 2, .d_model = 32};
constexpr int64_t kBatch = 8;  // global sequences per step

// Builds the GPT (on the meta device: deferred), sets activation checkpointing, shards each
// block with its reshard_after_forward and then the root over `mesh` (null: the world), and
// returns one AdamW training step on this rank's rows. On the meta device the token ids are
// shapes only; on the CPU they are fixed random ids made here, before the step, so the step
// allocates the same tensors in both.
enum class Precision { f32, fsdp_bf16, autocast_bf16 };

fsdp::TrainingStep setup(const fsdp::PlanSettings& s, const std::shared_ptr<dist::DeviceMesh>& mesh,
                         int64_t* shard_bytes = nullptr, Precision precision = Precision::f32) {
  const bool meta = default_device().is_meta();
  const int world = mesh ? mesh->size(0) : dist::world_size();
  const int64_t rows = kBatch / world;
  manual_seed(7);
  std::shared_ptr<apps::GPT> model;
  {
    DefaultDeviceGuard on_meta(Device::meta());
    model = std::make_shared<apps::GPT>(kConfig);
    apps::init_gpt(*model);
  }
  const int64_t before = memory_stats().live_bytes;
  fsdp::MixedPrecisionPolicy mp;
  if (precision == Precision::fsdp_bf16) mp = {.param_dtype = DType::bf16, .reduce_dtype = kFloat32};
  for (size_t i = 0; i < model->blocks.size(); ++i) {
    model->blocks[i]->set_checkpointing(s.activation_checkpointing);
    fsdp::fully_shard(model->blocks[i],
                      {.mesh = mesh, .reshard_after_forward = bool(s.reshard_after_forward[i]), .mp_policy = mp});
  }
  if (precision == Precision::fsdp_bf16) mp.output_dtype = kFloat32;
  fsdp::fully_shard(model, {.mesh = mesh, .mp_policy = mp});
  if (shard_bytes) *shard_bytes = memory_stats().live_bytes - before;
  auto opt = std::make_shared<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 1e-3});
  Tensor ids;
  if (!meta) ids = (rand({rows, kConfig.ctx + 1}) * double(kConfig.vocab_size)).to(kInt64);
  return [=] {
    auto take = [&](int64_t from) {
      return meta ? empty({rows, kConfig.ctx}, {.dtype = kInt64}) : ids.narrow(1, from, kConfig.ctx).contiguous();
    };
    opt->zero_grad();
    Tensor x = take(0), y = take(1), loss;
    {
      AutocastGuard autocast(DType::bf16, precision == Precision::autocast_bf16);
      loss = cross_entropy((*model)(x).view({-1, kConfig.vocab_size}), y.view({-1}));
    }
    loss.backward();
    nn::clip_grad_norm_(model->parameters(), 1.0);
    opt->step();
  };
}

fsdp::MemoryPlanRequest request(Precision precision = Precision::f32) {
  fsdp::MemoryPlanRequest r;
  r.setup = [precision](const fsdp::PlanSettings& s, const std::shared_ptr<dist::DeviceMesh>& mesh) {
    return setup(s, mesh, nullptr, precision);
  };
  r.world_size = dist::world_size();
  r.tunable_groups = int(kConfig.n_layer);
  r.can_checkpoint = true;
  return r;
}

struct Measured {
  int64_t peak = 0, shards = 0;
};

// This rank really trains two steps with `s`: the allocator's peak above the start.
Measured measure(const fsdp::PlanSettings& s, Precision precision = Precision::f32) {
  Measured m;
  const int64_t start = memory_stats().live_bytes;
  reset_peak_memory_stats();
  {
    fsdp::TrainingStep step = setup(s, nullptr, &m.shards, precision);
    for (int i = 0; i < 2; ++i) step();
  }
  m.peak = memory_stats().peak_bytes - start;
  return m;
}

// An unsharded Linear trained with AdamW, its input made inside the step: the plan and a real run allocate alike
// (bias-free: the CPU's bias gradient takes a buffer the meta device does not).
fsdp::TrainingStep linear_step(const fsdp::PlanSettings&, const std::shared_ptr<dist::DeviceMesh>&) {
  auto model = std::make_shared<nn::Linear>(16, 8, false);
  auto opt = std::make_shared<nn::AdamW>(model->parameters(), nn::AdamWOptions{.lr = 1e-3});
  return [=] {
    opt->zero_grad();
    cross_entropy((*model)(zeros({4, 16})), zeros({4}, {.dtype = kInt64})).backward();
    opt->step();
  };
}

fsdp::PlanSettings settings(bool reshard, nn::Checkpointing ac) {
  return {.reshard_after_forward = std::vector<bool>(size_t(kConfig.n_layer), reshard), .activation_checkpointing = ac};
}

}  // namespace

TEST_CASE("fully_shard over a fake mesh shards a meta model outside a memory plan") {
  nn::ModulePtr m;
  {
    DefaultDeviceGuard meta(Device::meta());
    m = std::make_shared<nn::Linear>(4, 8);
  }
  fsdp::fully_shard(m, {.mesh = dist::fake_mesh(1, 2)});  // had failed zeroing a view of the shards' meta storage
  auto params = m->named_parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0].second.shape() == Shape{4, 4});  // rank 1's rows of the [8, 4] weight
  CHECK(params[1].second.shape() == Shape{4});
  CHECK(params[0].second.device().is_meta());
}

TEST_CASE("plan_memory predicts the peak of training within 5 % and its shards exactly") {
  using enum nn::Checkpointing;
  struct Case {
    bool reshard;
    nn::Checkpointing ac;
    Precision precision;
  };
  for (auto [reshard, ac, precision] : {Case{true, none, Precision::f32}, {false, none, Precision::f32},
                                        {true, full, Precision::f32}, {true, selective, Precision::f32},
                                        {false, selective, Precision::f32}, {true, none, Precision::fsdp_bf16},
                                        {true, full, Precision::fsdp_bf16}, {true, selective, Precision::fsdp_bf16},
                                        {true, none, Precision::autocast_bf16}, {false, full, Precision::autocast_bf16},
                                        {false, selective, Precision::autocast_bf16}}) {
    fsdp::MemoryPlanRequest r = request(precision);
    r.settings = settings(reshard, ac);
    const fsdp::MemoryPlan plan = fsdp::plan_memory(r);
    const Measured got = measure(r.settings, precision);
    const double error = double(plan.peak_bytes - got.peak) / double(got.peak);
    INFO("rank " << dist::rank() << " of " << dist::world_size() << ", reshard_after_forward " << reshard
                 << ", checkpointing " << nn::checkpointing_name(ac) << ", precision " << int(precision) << ": predicted " << plan.peak_bytes << " bytes, measured " << got.peak
                 << " (" << 100 * error << " %); shards predicted " << plan.parts.shards << ", allocated "
                 << got.shards << "\n" << plan.table());
    CHECK(std::abs(error) <= 0.05);
    CHECK(plan.parts.shards == got.shards);
    const auto& p = plan.parts;
    CHECK(p.shards + p.gradients + p.optimizer_state + p.unsharded + p.activations + p.temporary == plan.peak_bytes);
    CHECK(p.activations > 0);
    CHECK(plan.fits);
  }
}

TEST_CASE("with a budget, plan_memory chooses settings that fit, and training with them stays under it") {
  fsdp::MemoryPlanRequest r = request();
  r.settings = settings(true, nn::Checkpointing::full);
  const int64_t smallest = fsdp::plan_memory(r).peak_bytes;
  r.settings = settings(false, nn::Checkpointing::none);
  const int64_t largest = fsdp::plan_memory(r).peak_bytes;
  INFO("smallest plan " << smallest << " bytes, largest " << largest);
  REQUIRE(smallest < largest);

  r.budget = (smallest + largest) / 2;
  const fsdp::MemoryPlan chosen = fsdp::plan_memory(r);
  INFO(chosen.table());
  CHECK(chosen.fits);
  CHECK(chosen.peak_bytes <= *r.budget);
  CHECK(chosen.tried.size() >= 2);
  CHECK(chosen.peak_bytes > smallest);  // the search keeps what the budget allows (faster settings)
  const Measured got = measure(chosen.settings);
  INFO("training with the chosen settings peaked at " << got.peak << " bytes; budget " << *r.budget);
  CHECK(got.peak <= *r.budget + *r.budget / 100);

  r.budget = smallest - 1;
  const fsdp::MemoryPlan refused = fsdp::plan_memory(r);
  INFO(refused.table());
  CHECK_FALSE(refused.fits);
  CHECK(refused.peak_bytes == smallest);
  CHECK(refused.settings.activation_checkpointing == nn::Checkpointing::full);
  CHECK(refused.table().find("does NOT fit: over by") != std::string::npos);
}

TEST_CASE("with a budget, plan_memory keeps the settings the caller fixed and chooses the rest") {
  fsdp::MemoryPlanRequest r = request();
  r.budget = int64_t(1) << 40;  // everything fits: the search would keep every group gathered, without recomputation
  r.fixed_checkpointing = nn::Checkpointing::full;
  fsdp::MemoryPlan p = fsdp::plan_memory(r);
  INFO(p.table());
  CHECK(p.settings.activation_checkpointing == nn::Checkpointing::full);
  CHECK(p.settings.reshard_after_forward == std::vector<bool>(size_t(kConfig.n_layer), false));
  r.fixed_checkpointing.reset();
  r.fixed_reshard = true;
  p = fsdp::plan_memory(r);
  INFO(p.table());
  CHECK(p.settings.activation_checkpointing == nn::Checkpointing::none);
  CHECK(p.settings.reshard_after_forward == std::vector<bool>(size_t(kConfig.n_layer), true));
  // A budget the fixed settings cannot meet is refused even where others would fit.
  fsdp::MemoryPlanRequest least = request();
  least.settings = settings(true, nn::Checkpointing::full);
  const int64_t smallest = fsdp::plan_memory(least).peak_bytes;
  r.fixed_reshard = false;
  r.fixed_checkpointing = nn::Checkpointing::none;
  r.budget = smallest + 1;
  CHECK_FALSE(fsdp::plan_memory(r).fits);
}

TEST_CASE("plan_memory leaves the random state and the memory counters of the real run alone") {
  manual_seed(3);
  const Generator::State before = default_generator().state();
  const MemoryStats cpu_before = memory_stats();
  fsdp::MemoryPlanRequest r = request();
  r.settings = settings(true, nn::Checkpointing::none);
  fsdp::plan_memory(r);
  CHECK(default_generator().state().offset == before.offset);
  CHECK(memory_stats().live_bytes == cpu_before.live_bytes);
  CHECK(memory_stats(Device::meta()).live_bytes == 0);
}

TEST_CASE("plan_memory counts the step counts the optimizer keeps on the host: a CPU run's peak to the byte") {
  fsdp::MemoryPlanRequest r;
  r.setup = linear_step;
  r.sharded = false;
  const int64_t planned = fsdp::plan_memory(r).peak_bytes;
  const int64_t start = memory_stats().live_bytes;
  reset_peak_memory_stats();
  {
    fsdp::TrainingStep step = linear_step({}, nullptr);
    step();
    step();
  }
  CHECK(planned == memory_stats().peak_bytes - start);
  r.device = Device::cuda(0);  // host memory, not the device's
  CHECK(fsdp::plan_memory(r).peak_bytes == planned - 4);  // the weight's step count
}

TEST_CASE("plan_memory counts what reading the model's values holds beside the model") {
  fsdp::MemoryPlanRequest r;
  r.setup = linear_step;
  r.sharded = false;
  r.load_bytes = [] { return int64_t(1) << 20; };  // more than training adds to the model
  const fsdp::MemoryPlan plan = fsdp::plan_memory(r);
  INFO(plan.table());
  CHECK(plan.peak_bytes == 16 * 8 * 4 + (int64_t(1) << 20));  // the weight, and the load's buffer beside it
  CHECK(plan.peak_at == "loading the model's values");
  CHECK(plan.parts.shards + plan.parts.temporary == plan.peak_bytes);
}
