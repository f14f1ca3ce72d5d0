// FSDP1/FairScale conveniences on top of fully_shard: nn::clip_grad_norm_ over sharded gradients,
// SummonFullParams, sharding-strategy presets and auto-wrap policies. Each trains with parity
// against plain single-process training of the same seeded model on the same global batches
// (each rank takes its slice), as tests/test_fsdp_parity.cpp. Runs under mpirun at 1, 2, 4 ranks.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "fsdp/state.h"
#include "weft.h"
#include "fsdp_test_models.h"

using namespace weft;
using namespace weft::fsdp_test;

namespace {

// After AdamW steps, an element whose gradient is of the order of Adam's eps (1e-8) moves by
// lr * g / (|g| + eps), so the f32 rounding of another reduction order (about 1e-9 on such a
// gradient, e.g. -1.06e-7 against a largest element of 2e-2 in this suite's TinyGPT at 4 ranks)
// shifts it by up to ~1e-5 at lr 1e-2 (4e-6 measured). Trained parameters are compared with
// that floor; untrained ones (and tests/test_fsdp_parity.cpp's) with 1e-6.
constexpr double kAdamTrainedAtol = 1e-5;

void check_params(nn::Module& ref, const fsdp::FSDPModule& root, const std::string& what, double atol = 1e-6) {
  for (auto& [name, p] : ref.named_parameters())
    check_close(to_vector(root.full_tensor(name)), to_vector(p), 1e-5, what + ": parameter " + name, atol);
}

// Optional steps of a parity run, called on both models at the same points.
struct Callbacks {
  // After sharding, before training (e.g. edit parameters the same way in both).
  std::function<void(nn::Module& ref, nn::Module& model, fsdp::FSDPModule& root)> setup;
  // After backward, before the optimizer step (e.g. clip).
  std::function<void(nn::Module& ref, nn::Module& model, fsdp::FSDPModule& root, int step)> after_backward;
  // Around each FSDP step's forward and backward (e.g. collective counts).
  std::function<void(fsdp::FSDPModule& root, int step, const char* when)> on;
};

// `steps` AdamW steps with FSDP (shard(model) returns the root) and without; compares losses
// each step and the full parameters at the end.
template <class Model, class MakeBatch, class Shard>
void run_parity(MakeBatch make_batch, Shard shard, const Callbacks& cb = {}, int steps = 6) {
  manual_seed(7);
  auto ref = std::make_shared<Model>();
  manual_seed(7);
  auto model = std::make_shared<Model>();
  fsdp::FSDPModule root = shard(model);
  if (cb.setup) cb.setup(*ref, *model, root);
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2});
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  for (int step = 0; step < steps; ++step) {
    ref_opt.zero_grad();
    opt.zero_grad();
    Batch global = make_batch(step);
    Tensor l_ref = loss_of(*ref, global);
    l_ref.backward();
    if (cb.on) cb.on(root, step, "start");
    Tensor l = loss_of(*model, slice(global));
    if (cb.on) cb.on(root, step, "forward");
    l.backward();
    if (cb.on) cb.on(root, step, "backward");
    if (cb.after_backward) cb.after_backward(*ref, *model, root, step);
    ref_opt.step();
    opt.step();
    check_close({global_mean(l.item())}, {l_ref.item()}, 1e-5, fmt::format("loss at step {}", step));
  }
  check_params(*ref, root, "after training", kAdamTrainedAtol);
}

fsdp::FSDPModule shard_mlp(const std::shared_ptr<UnevenMLP>& m, const fsdp::FullyShardOptions& o = {}) {
  fsdp::fully_shard(m->fc1, o);
  fsdp::fully_shard(m->fc2, o);
  return fsdp::fully_shard(m, o);
}
fsdp::FSDPModule shard_gpt(const std::shared_ptr<TinyGPT>& m, const fsdp::FullyShardOptions& o = {}) {
  for (auto& b : *m->blocks) fsdp::fully_shard(b, o);
  return fsdp::fully_shard(m, o);
}

// A whole model and its sharded twin, both made from `seed`: members, not a structured binding, which clang 14 cannot
// capture in the tests' lambdas.
template <class M>
struct Twins {
  std::shared_ptr<M> ref, m;
  fsdp::FSDPModule root;
};
template <class M, class Shard>
Twins<M> twins(uint64_t seed, Shard shard) {
  manual_seed(seed);
  auto ref = std::make_shared<M>();
  manual_seed(seed);
  auto m = std::make_shared<M>();
  return {ref, m, shard(m)};
}

double sum_of(const Tensor& t) {
  double s = 0;
  for (double v : to_vector(t)) s += v;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// clip_grad_norm_

TEST_CASE("clip_grad_norm_: one function for sharded and unsharded models, the same norm and clipped grads") {
  // nn::clip_grad_norm_ on the shards (model.parameters() after fully_shard) against the same
  // call on the unsharded reference: the norm of every step, and (through parity of the
  // trained parameters) the clipped gradients.
  for (double norm_type : std::vector<double>{2.0, INFINITY, 1.0, 3.0}) {
    INFO("norm_type " << norm_type);
    Callbacks cb;
    cb.after_backward = [&](nn::Module& ref, nn::Module& model, fsdp::FSDPModule&, int step) {
      // Below every step's norm, so clipping is active, but not far below: gradients scaled
      // down ~10x leave near-zero elements where AdamW's eps turns reduction-order rounding
      // into parameter differences above 1e-5.
      const double max_norm = 0.8 * nn::clip_grad_norm_(ref.parameters(), 1e30, norm_type);
      double want = nn::clip_grad_norm_(ref.parameters(), max_norm, norm_type);
      double got = nn::clip_grad_norm_(model.parameters(), max_norm, norm_type);
      check_close({got}, {want}, 1e-5, fmt::format("norm at step {}", step));
      CHECK(want > max_norm);
    };
    run_parity<UnevenMLP>([](int s) { return mlp_batch(s); }, [](auto m) { return shard_mlp(m); }, cb);
    run_parity<TinyGPT>([](int s) { return gpt_batch(s); }, [](auto m) { return shard_gpt(m); }, cb);
  }
}

// Deterministic mode: a global batch of 8 micro-batches (V = 8); one process sums their
// gradients with nn::TreeSum, FSDP at W ranks runs its 8 / W with set_requires_gradient_sync
// on the last only. The same bits: every micro-batch's loss, the clipped norm, the reduced
// gradients and the parameters after AdamW. The MLP's uneven shapes give the ranks shards of
// different lengths (the last may hold none of a row), as the norm's gather must handle.
template <class Model, class MakeBatch, class Shard>
void run_deterministic(MakeBatch make_batch, Shard shard) {
  constexpr int64_t V = 8;
  set_deterministic(true);
  manual_seed(7);
  auto ref = std::make_shared<Model>();
  manual_seed(7);
  auto model = std::make_shared<Model>();
  fsdp::FSDPModule root = shard(model);
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2});
  nn::AdamW opt(model->parameters(), {.lr = 1e-2});
  const int64_t W = dist::world_size(), per_rank = V / W;
  nn::TreeSum tree;
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    opt.zero_grad();
    Batch global = make_batch(step);
    const int64_t rows = global.x.size(0) / V;
    auto micro = [&](int64_t m) { return Batch{global.x.narrow(0, m * rows, rows), global.y.narrow(0, m * rows, rows)}; };
    std::vector<double> ref_losses;
    for (int64_t m = 0; m < V; ++m) {
      Tensor l = loss_of(*ref, micro(m));
      ref_losses.push_back(l.item());
      (l * (1.0 / double(V))).backward();
      nn::add_grads_as_leaf(tree, ref->parameters());
    }
    nn::set_grads_to_total(tree, ref->parameters());
    for (int64_t j = 0; j < per_rank; ++j) {
      root.set_requires_gradient_sync(j + 1 == per_rank);
      Tensor l = loss_of(*model, micro(dist::rank() * per_rank + j));
      CHECK(l.item() == ref_losses[size_t(dist::rank() * per_rank + j)]);
      (l * (1.0 / double(per_rank))).backward();
    }
    std::map<std::string, Tensor> shards;
    for (auto& [name, p] : model->named_parameters()) shards[name] = p;
    for (auto& [name, p] : ref->named_parameters()) {
      const std::vector<double> got = to_vector(root.gather_shard(name, shards.at(name).grad()));
      const std::vector<double> want = to_vector(p.grad());
      INFO(fmt::format("step {}: gradient of {} (first element {:.17g} vs {:.17g})", step, name,
                       got.empty() ? 0.0 : got[0], want.empty() ? 0.0 : want[0]));
      CHECK(got == want);
    }
    const double want = nn::clip_grad_norm_(ref->parameters(), 0.05);
    const double got = nn::clip_grad_norm_(model->parameters(), 0.05);
    INFO(fmt::format("step {}: norm {:.17g} vs {:.17g}", step, got, want));
    CHECK(got == want);
    ref_opt.step();
    opt.step();
  }
  for (auto& [name, p] : ref->named_parameters()) {
    INFO("parameter " + name + " after training");
    CHECK(to_vector(root.full_tensor(name)) == to_vector(p));
  }
  set_deterministic(false);
}

TEST_CASE("deterministic mode: the same bits at 1, 2 and 4 ranks as one process's tree of micro-batches") {
  run_deterministic<UnevenMLP>([](int s) { return mlp_batch(s, 16); }, [](auto m) { return shard_mlp(m); });
  run_deterministic<TinyGPT>([](int s) { return gpt_batch(s, 8); }, [](auto m) { return shard_gpt(m); });
}

TEST_CASE("clip_grad_norm_: sharded and whole parameters in one call") {
  manual_seed(1);
  auto m = std::make_shared<UnevenMLP>();
  auto root = shard_mlp(m);
  loss_of(*m, slice(mlp_batch(0))).backward();
  // A parameter outside FSDP, the same on every rank: counted once, not once per rank.
  Tensor extra = zeros({2});
  extra.set_requires_grad(true);
  extra.set_grad(from_vector({3.0, -4.0}, {2}));
  std::vector<Tensor> all = m->parameters();
  all.push_back(extra);
  const double sharded = nn::clip_grad_norm_(m->parameters(), 1e30);
  CHECK(nn::clip_grad_norm_(all, 1e30) == Approx(std::sqrt(sharded * sharded + 25.0)));
  const double sharded_inf = nn::clip_grad_norm_(m->parameters(), 1e30, INFINITY);
  CHECK(nn::clip_grad_norm_(all, 1e30, INFINITY) == Approx(std::max(sharded_inf, 4.0)));
}

TEST_CASE("clip_grad_norm_ of an FSDPModule reduces over the shard group only (NO_SHARD, HSDP)") {
  std::vector<int> sizes{1};
  if (dist::world_size() % 2 == 0) sizes.push_back(2);
  for (int shard : sizes) {
    INFO("HYBRID_SHARD with shard groups of " << shard << " (1: NO_SHARD's layout)");
    auto opts = fsdp::strategy_options(fsdp::ShardingStrategy::HYBRID_SHARD, shard);
    Callbacks cb;
    cb.after_backward = [](nn::Module& ref, nn::Module&, fsdp::FSDPModule& root, int step) {
      double want = nn::clip_grad_norm_(ref.parameters(), 0.5);
      double got = step % 2 ? fsdp::clip_grad_norm_(root, 0.5) : nn::clip_grad_norm_(root.module().parameters(), 0.5);
      check_close({got}, {want}, 1e-5, fmt::format("norm at step {}", step));
      CHECK(want > 0.5);
    };
    run_parity<TinyGPT>([](int s) { return gpt_batch(s); }, [&](auto m) { return shard_gpt(m, opts); }, cb);
  }
}

TEST_CASE("clip_grad_norm_: bad arguments fail on every rank") {
  manual_seed(1);
  auto m = std::make_shared<UnevenMLP>();
  auto root = shard_mlp(m);
  loss_of(*m, slice(mlp_batch(0))).backward();
  CHECK_THROWS_WITH(nn::clip_grad_norm_(m->parameters(), 1.0, -1.0), Catch::Contains("norm_type must be > 0 or inf"));
  CHECK_THROWS_WITH(fsdp::clip_grad_norm_(root, -1.0), Catch::Contains("max_norm must be >= 0"));
  if (dist::world_size() > 1) {  // one rank's value differs, or only one rank's is refused: every rank throws
    const int rank = dist::rank();
    CHECK_THROWS_WITH(nn::clip_grad_norm_(m->parameters(), rank == 1 ? 2.0 : 1.0), Catch::Contains("disagree"));
    CHECK_THROWS_WITH(nn::clip_grad_norm_(m->parameters(), 1.0, rank == 1 ? 1.0 : 2.0), Catch::Contains("disagree"));
    CHECK_THROWS_WITH(nn::clip_grad_norm_(m->parameters(), rank == 0 ? NAN : 1.0), Catch::Contains("max_norm must be >= 0"));
  }
  // Not clipping (max_norm above the norm) leaves gradients untouched.
  std::vector<std::vector<double>> before;
  for (auto& p : m->parameters()) before.push_back(to_vector(p.grad()));
  double norm = fsdp::clip_grad_norm_(root, 1e9);
  CHECK(norm > 0);
  size_t i = 0;
  for (auto& p : m->parameters()) CHECK(to_vector(p.grad()) == before[i++]);
}

// ---------------------------------------------------------------------------------------------
// SummonFullParams

TEST_CASE("SummonFullParams: full parameters inside, shards again after") {
  auto twin = twins<UnevenMLP>(3, [](auto m) { return shard_mlp(m); });
  auto ref = twin.ref, m = twin.m;
  auto& root = twin.root;
  auto shard_shapes = [&] {
    std::vector<Shape> s;
    for (auto& p : m->parameters()) s.push_back(p.shape());
    return s;
  };
  auto sharded = shard_shapes();
  {
    fsdp::SummonFullParams full(root);
    auto named = m->named_parameters();
    auto ref_named = ref->named_parameters();
    REQUIRE(named.size() == ref_named.size());
    for (size_t i = 0; i < named.size(); ++i) {
      CHECK(named[i].first == ref_named[i].first);
      CHECK(named[i].second.shape() == ref_named[i].second.shape());
      CHECK(to_vector(named[i].second) == to_vector(ref_named[i].second));
    }
    CHECK(m->fc1->weight.requires_grad());
  }
  CHECK(shard_shapes() == sharded);
  check_params(*ref, root, "after a read-only summon");
}

TEST_CASE("SummonFullParams: edits persist into the shards and training continues with parity") {
  auto edit = [](nn::Module& mod) {
    auto& m = dynamic_cast<UnevenMLP&>(mod);
    NoGradGuard ng;
    m.fc1->weight.fill_(0.05);  // 15 rows: padded at 2 and 4 ranks
    m.fc2->bias.copy_(from_vector({0.1, -0.2, 0.3}, {3}));
    m.fc2->weight.narrow(1, 0, 5).zero_();  // a partial edit of a parameter sharded to 1 row per rank
  };
  Callbacks cb;
  cb.setup = [&](nn::Module& ref, nn::Module& model, fsdp::FSDPModule& root) {
    edit(ref);
    {
      fsdp::SummonFullParams full(root);
      edit(model);
    }
    check_params(ref, root, "right after the guard");
    // Padding is zero still: each padded chunk sums to its shard.
    for (auto& [n, mod] : model.named_modules())
      if (auto s = fsdp::state_of(*mod); s && s->group)
        for (auto& p : s->group->params()) CHECK(sum_of(p->padded_flat()) == sum_of(p->sharded()));
  };
  run_parity<UnevenMLP>([](int s) { return mlp_batch(s); }, [](auto m) { return shard_mlp(m); }, cb);
}

TEST_CASE("SummonFullParams: a parameter replaced inside the guard is written back like an edit; a wrong shape is refused") {
  auto twin = twins<UnevenMLP>(6, [](auto m) { return shard_mlp(m); });
  auto ref = twin.ref, m = twin.m;
  auto& root = twin.root;
  {
    fsdp::SummonFullParams guard(root);
    m->fc1->set_parameter("weight", full({15, 7}, 0.25));  // a new tensor, not an in-place edit
    NoGradGuard ng;  // a forward inside the guard computes with it
    ref->fc1->weight.fill_(0.25);
    const Tensor x = from_vector(std::vector<double>(14, 0.5), {2, 7});
    CHECK(to_vector((*m)(x)) == to_vector((*ref)(x)));
    ref->fc1->bias.fill_(0.125);  // and a forward of the very module that holds it
    m->fc1->set_parameter("bias", full({15}, 0.125));
    CHECK(to_vector((*m->fc1)(x)) == to_vector((*ref->fc1)(x)));
  }
  check_params(*ref, root, "after a replaced parameter");
  {
    fsdp::SummonFullParams guard(root);
    Tensor kept = m->fc2->bias;
    m->fc2->set_parameter("bias", zeros({4}));
    CHECK_THROWS_WITH(guard.exit(), Catch::Contains("bias was replaced inside the guard by f32[4]") &&
                                        Catch::Contains("not a tensor of its full shape"));
    m->fc2->set_parameter("bias", kept);  // the guard is still active: put it back and end it
  }
  check_params(*ref, root, "after a refused replacement");
  const Shape shard_shape = m->fc2->bias.shape();
  {
    fsdp::SummonFullParams guard(root);  // never put back: the guard's end restores the shards, unedited
    m->fc2->set_parameter("bias", zeros({4}));
  }
  CHECK(m->fc2->bias.shape() == shard_shape);
  check_params(*ref, root, "after a replacement the guard's end refused");
}

TEST_CASE("SummonFullParams: writeback = false discards edits; rank0_only") {
  auto twin = twins<UnevenMLP>(4, [](auto m) { return shard_mlp(m); });
  auto ref = twin.ref, m = twin.m;
  auto& root = twin.root;
  {
    fsdp::SummonFullParams full(root, {.writeback = false});
    NoGradGuard ng;
    m->fc1->weight.fill_(3.0);
  }
  check_params(*ref, root, "after a discarded edit");
  Shape shard_shape = m->fc1->weight.shape();
  {
    fsdp::SummonFullParams full(root, {.writeback = false, .rank0_only = true});
    CHECK(m->fc1->weight.shape() == (dist::rank() == 0 ? Shape{15, 7} : shard_shape));
    if (dist::rank() == 0) CHECK(to_vector(m->fc1->weight) == to_vector(ref->fc1->weight));
  }
  CHECK(m->fc1->weight.shape() == shard_shape);
  CHECK_THROWS_WITH(fsdp::SummonFullParams(root, {.writeback = true, .rank0_only = true}),
                    Catch::Contains("rank0_only needs writeback = false"));
}

TEST_CASE("SummonFullParams: a no-grad forward inside the guard sees the edits") {
  auto twin = twins<TinyGPT>(5, [](auto m) { return shard_gpt(m); });
  auto ref = twin.ref, m = twin.m;
  auto& root = twin.root;
  auto edit = [](TinyGPT& g) {
    NoGradGuard ng;
    g.head->weight.narrow(0, 0, 4).fill_(0.25);
    { Tensor w = g.blocks->at<nn::Block>(1)->mlp->c_fc->weight; w.copy_(w * 0.5); }
  };
  edit(*ref);
  Batch b = gpt_batch(0);
  Tensor want;
  {
    NoGradGuard ng;
    want = (*ref)(b.x);
  }
  {
    fsdp::SummonFullParams full(root);
    edit(*m);
    {
      NoGradGuard ng;
      check_close(to_vector((*m)(b.x)), to_vector(want), 1e-5, "logits of a forward inside the guard");
      check_close(to_vector((*m)(b.x)), to_vector(want), 1e-5, "logits of a second forward");
    }
    CHECK(m->head->weight.shape() == Shape{11, 12});  // full tensors again after the forward
    // With gradients it is refused (after fully_shard's own hooks ran: the guard cleans up).
    CHECK_THROWS_WITH((*m)(b.x), Catch::Contains("NoGradGuard only"));
  }
  check_params(*ref, root, "after the guard");
  // Training goes on normally.
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2}), opt(m->parameters(), {.lr = 1e-2});
  for (int step = 0; step < 3; ++step) {
    Batch g = gpt_batch(10 + step);
    ref_opt.zero_grad();
    opt.zero_grad();
    Tensor lr = loss_of(*ref, g);
    lr.backward();
    Tensor l = loss_of(*m, slice(g));
    l.backward();
    ref_opt.step();
    opt.step();
    check_close({global_mean(l.item())}, {lr.item()}, 1e-5, fmt::format("loss at step {}", step));
  }
  check_params(*ref, root, "after training", kAdamTrainedAtol);
}

TEST_CASE("SummonFullParams: refused inside backward, between forward and backward, and nested") {
  manual_seed(6);
  auto m = std::make_shared<TinyGPT>();
  auto root = shard_gpt(m);
  Batch b = slice(gpt_batch(0));
  // The root keeps its parameters gathered from forward to backward.
  Tensor l = loss_of(*m, b);
  CHECK_THROWS_WITH(fsdp::SummonFullParams(root), Catch::Contains("between training steps"));
  // Inside backward: from a gradient hook.
  std::string error;
  Tensor h = (*m->wte)(b.x);
  l = l + sum(h) * 0.0;
  h.register_hook([&](const Tensor&) {
    try {
      fsdp::SummonFullParams full(root);
    } catch (const Error& e) {
      error = e.what();
    }
    return Tensor();
  });
  l.backward();
  CHECK_THAT(error, Catch::Contains("inside backward"));
  {
    fsdp::SummonFullParams full(root);
    CHECK_THROWS_WITH(fsdp::SummonFullParams(fsdp::fsdp_module(*m->blocks->at<nn::Block>(0)).value()),
                      Catch::Contains("nested"));
  }
  // And afterwards a normal step works.
  m->zero_grad();
  loss_of(*m, b).backward();
  CHECK(m->head->weight.grad().defined());
}

TEST_CASE("SummonFullParams under mixed precision gives the f32 master weights, unchanged on exit") {
  manual_seed(8);
  auto ref = std::make_shared<UnevenMLP>();
  manual_seed(8);
  auto m = std::make_shared<UnevenMLP>();
  fsdp::FullyShardOptions bf16;
  bf16.mp_policy.param_dtype = DType::bf16;
  auto root = shard_mlp(m, bf16);
  std::vector<std::vector<double>> shards;
  for (auto& p : m->parameters()) shards.push_back(to_vector(p));
  {
    fsdp::SummonFullParams full(root);
    CHECK(m->fc1->weight.dtype() == DType::f32);
    CHECK(to_vector(m->fc1->weight) == to_vector(ref->fc1->weight));
  }
  size_t i = 0;
  for (auto& p : m->parameters()) CHECK(to_vector(p) == shards[i++]);  // bitwise
}

// ---------------------------------------------------------------------------------------------
// Sharding strategies

TEST_CASE("strategy presets train with parity") {
  using S = fsdp::ShardingStrategy;
  const int world = dist::world_size();
  struct Case {
    S strategy;
    int shard_size;
  };
  std::vector<Case> cases{{S::FULL_SHARD, 0}, {S::SHARD_GRAD_OP, 0}, {S::NO_SHARD, 0}};
  for (int shard : {1, 2, 4})
    if (world % shard == 0) cases.push_back({S::HYBRID_SHARD, shard});
  if (world != 4) WARN("HYBRID_SHARD 2x2 (2 replicas of 2 shards) needs 4 ranks; world size " << world);
  const int groups = 3;  // two blocks and the root
  for (auto c : cases) {
    INFO(fsdp::strategy_name(c.strategy) << " shard_size " << c.shard_size << " at world " << world);
    auto opts = fsdp::strategy_options(c.strategy, c.shard_size);
    const int shards = opts.mesh->size(opts.mesh->ndim() - 1);
    const int replicas = opts.mesh->ndim() == 2 ? opts.mesh->size(0) : 1;
    CHECK(shards * replicas == world);
    fsdp::CommStats at_start, at_forward;
    Callbacks cb;
    cb.setup = [&](nn::Module&, nn::Module& model, fsdp::FSDPModule&) {
      auto& g = dynamic_cast<TinyGPT&>(model);
      int64_t chunk = (11 + shards - 1) / shards;  // head.weight has 11 rows
      int64_t rows = std::clamp<int64_t>(11 - int64_t(opts.mesh->coordinate(opts.mesh->ndim() - 1)) * chunk, 0, chunk);
      CHECK(g.head->weight.shape() == Shape{rows, 12});  // NO_SHARD: the full parameter
    };
    cb.on = [&](fsdp::FSDPModule& root, int, const char* when) {
      auto now = root.comm_stats();
      if (std::string(when) == "start") at_start = now;
      if (std::string(when) == "forward") {
        at_forward = now;
        CHECK(now.all_gathers - at_start.all_gathers == groups);
      }
      if (std::string(when) == "backward") {
        // Gathered again for backward: the blocks when they resharded after forward.
        int regathered = c.strategy == S::SHARD_GRAD_OP || c.strategy == S::NO_SHARD ? 0 : groups - 1;
        CHECK(now.all_gathers - at_forward.all_gathers == regathered);
        CHECK(now.reduce_scatters - at_start.reduce_scatters == groups);
        CHECK(now.all_reduces - at_start.all_reduces == (replicas > 1 ? groups : 0));
      }
    };
    run_parity<TinyGPT>([](int s) { return gpt_batch(s); }, [&](auto m) { return shard_gpt(m, opts); }, cb);
  }
}

TEST_CASE("strategy presets: bad shard sizes fail on every rank") {
  using S = fsdp::ShardingStrategy;
  const int world = dist::world_size();
  CHECK_THROWS_WITH(fsdp::strategy_options(S::HYBRID_SHARD, world + 1),
                    Catch::Contains("HYBRID_SHARD needs a shard group size that divides the world size"));
  CHECK_THROWS_WITH(fsdp::strategy_options(S::HYBRID_SHARD), Catch::Contains("divides the world size"));
  CHECK_THROWS_WITH(fsdp::strategy_options(S::NO_SHARD, 2), Catch::Contains("applies to HYBRID_SHARD only"));
  CHECK(fsdp::parse_sharding_strategy("shard_grad_op") == S::SHARD_GRAD_OP);
  CHECK_THROWS_WITH(fsdp::parse_sharding_strategy("ZERO3"), Catch::Contains("unknown sharding strategy"));
  // The world is still in step: a collective after the refusals completes.
  CHECK(global_mean(1.0) == 1.0);
}

// ---------------------------------------------------------------------------------------------
// Auto-wrap

namespace {

// The dotted names of the sharded modules of a tree ("" for the root).
std::vector<std::string> wrapped(nn::Module& root) {
  std::vector<std::string> out;
  for (auto& [name, m] : root.named_modules())
    if (fsdp::fsdp_module(*m)) out.push_back(name);
  return out;
}

}  // namespace

TEST_CASE("auto-wrap by module type and by size wraps the expected modules and trains with parity") {
  using V = std::vector<std::string>;
  struct Case {
    const char* what;
    fsdp::AutoWrapPolicy policy;
    V expected;
  };
  std::vector<Case> cases{
      {"type Block", fsdp::module_type_policy({"Block"}), V{"", "blocks.0", "blocks.1"}},
      // 1200: a block (1752) reaches it, nothing inside one (attn 576, mlp 1152) does.
      {"size 1200", fsdp::size_based_policy(1200), V{"", "blocks.0", "blocks.1"}},
      // 500: each linear of the mlp (576), then attn (432 + 144 left unwrapped); the mlp and the
      // block have too little left (0 and 24).
      {"size 500", fsdp::size_based_policy(500),
       V{"", "blocks.0.attn", "blocks.0.mlp.c_fc", "blocks.0.mlp.c_proj", "blocks.1.attn", "blocks.1.mlp.c_fc",
         "blocks.1.mlp.c_proj"}},
      {"type Linear or LayerNorm", fsdp::module_type_policy({"Linear", "LayerNorm"}),
       V{"", "blocks.0.ln_1", "blocks.0.attn.c_attn", "blocks.0.attn.c_proj", "blocks.0.ln_2", "blocks.0.mlp.c_fc",
         "blocks.0.mlp.c_proj", "blocks.1.ln_1", "blocks.1.attn.c_attn", "blocks.1.attn.c_proj", "blocks.1.ln_2",
         "blocks.1.mlp.c_fc", "blocks.1.mlp.c_proj", "ln_f", "head"}},
  };
  for (auto& c : cases) {
    INFO("policy " << c.what);
    Callbacks cb;
    cb.setup = [&](nn::Module&, nn::Module& model, fsdp::FSDPModule&) { CHECK(wrapped(model) == c.expected); };
    run_parity<TinyGPT>([](int s) { return gpt_batch(s); },
                        [&](auto m) { return fsdp::apply_auto_wrap(m, c.policy); }, cb, 5);
  }
}

TEST_CASE("auto-wrap: the policy sees unwrapped counts; modules sharded by hand are kept; errors") {
  manual_seed(9);
  auto m = std::make_shared<TinyGPT>();
  fsdp::fully_shard(m->blocks->at<nn::Block>(0));
  std::vector<std::pair<std::string, int64_t>> seen;
  auto policy = [&](const nn::Module& mod, const std::string& path, int64_t unwrapped) {
    seen.push_back({path, unwrapped});
    return mod.type_name() == "Block";
  };
  auto root = fsdp::apply_auto_wrap(m, policy);
  CHECK(wrapped(*m) == std::vector<std::string>{"", "blocks.0", "blocks.1"});
  auto count = [&](const std::string& path) {
    for (auto& [p, n] : seen)
      if (p == path) return n;
    return int64_t(-1);
  };
  CHECK(count("blocks.0") == -1);  // sharded by hand: not asked
  CHECK(count("blocks.1") == 1752);
  CHECK(count("blocks.1.attn") == 576);
  CHECK(count("blocks") == 0);  // its blocks are wrapped
  CHECK(count("head") == 143);
  CHECK(count("") == -1);  // the root is always wrapped
  CHECK_THROWS_WITH(fsdp::apply_auto_wrap(m, policy), Catch::Contains("already sharded"));
  CHECK_THROWS_WITH(fsdp::size_based_policy(0), Catch::Contains("min_num_params must be positive"));
  // Sharding strategy options pass through to every wrapped module.
  auto m2 = std::make_shared<TinyGPT>();
  auto opts = fsdp::strategy_options(fsdp::ShardingStrategy::SHARD_GRAD_OP);
  auto root2 = fsdp::apply_auto_wrap(m2, fsdp::module_type_policy({"Block"}), opts);
  CHECK(fsdp::state_of(*m2->blocks->at<nn::Block>(1))->mesh == opts.mesh);
  CHECK(root2.state()->mesh == opts.mesh);
}

// ---------------------------------------------------------------------------------------------
// LoRA (frozen base parameters)

TEST_CASE("LoRA under fully_shard: only the adapters get gradients and are reduce-scattered, with parity") {
  const int64_t world = dist::world_size();
  const nn::LoRAOptions lora{.rank = 2, .alpha = 4, .targets = {"c_attn", "c_proj"}};
  auto make = [&] {
    manual_seed(7);
    auto m = std::make_shared<TinyGPT>();
    Generator g(3);
    nn::apply_lora(*m, lora, &g);
    return m;
  };
  auto trainable = [](nn::Module& m) {
    std::vector<Tensor> out;
    for (auto& [name, p] : m.named_parameters())
      if (p.requires_grad()) out.push_back(p);
    return out;
  };
  auto ref = make(), model = make();
  fsdp::FSDPModule root = shard_gpt(model);
  nn::AdamW ref_opt(trainable(*ref), {.lr = 1e-2}), opt(trainable(*model), {.lr = 1e-2});
  // The blocks' reduce-scatters carry each adapter's padded chunk from every rank, nothing of
  // the frozen weights; the root's group (embedding, final norm, head) is all frozen: none.
  int64_t columns = 0;
  for (auto& [name, p] : ref->named_parameters())
    if (nn::is_lora_parameter(name)) columns += (p.size(0) + world - 1) / world * p.size(1);
  for (int step = 0; step < 4; ++step) {
    ref_opt.zero_grad();
    opt.zero_grad();
    Batch global = gpt_batch(step);
    Tensor l_ref = loss_of(*ref, global);
    l_ref.backward();
    fsdp::CommStats before = root.comm_stats();
    Tensor l = loss_of(*model, slice(global));
    l.backward();
    fsdp::CommStats after = root.comm_stats();
    CHECK(after.reduce_scatters - before.reduce_scatters == 2);
    CHECK(after.reduce_scatter_elements - before.reduce_scatter_elements == world * columns);
    for (auto& [name, p] : model->named_parameters()) {
      INFO(name << " at step " << step);
      CHECK(p.grad().defined() == nn::is_lora_parameter(name));
    }
    ref_opt.step();
    opt.step();
    check_close({global_mean(l.item())}, {l_ref.item()}, 1e-5, fmt::format("loss at step {}", step));
  }
  check_params(*ref, root, "after training", kAdamTrainedAtol);
}

// Module::load_state_dict works on the module's own tensors: on a sharded model those are this rank's shards, so a
// full state dict does not fit them; the error says so and names fsdp's full state dict (it gave shapes only).
TEST_CASE("Module::load_state_dict of a full state dict into a sharded model names fsdp's full state dict") {
  auto whole = std::make_shared<nn::Linear>(4, 6);
  const nn::NamedTensorList full = whole->state_dict();
  auto sharded = std::make_shared<nn::Linear>(4, 6);
  fsdp::FSDPModule root = fsdp::fully_shard(sharded);
  if (dist::world_size() == 1) {  // one rank's shards are the whole tensors: it loads
    CHECK_NOTHROW(sharded->load_state_dict(full));
    return;
  }
  CHECK_THROWS_WITH(sharded->load_state_dict(full), Catch::Matchers::Contains("shape mismatch") &&
                                                        Catch::Matchers::Contains("fsdp::load_full_state_dict"));
  fsdp::load_full_state_dict(*sharded, full, &root);
  CHECK(to_vector(fsdp::full_state_dict(*sharded, &root)[0].second) == to_vector(full[0].second));
}

// Module::to converts tensors in place by giving them new storage; a shard made by fully_shard lives in its group's
// flat buffer, which the conversion would leave behind (the group then gathered the old values, or failed later in a
// GEMM on the mixed dtypes). So converting a sharded model, or a module inside one, is refused at the call on every
// rank, naming fully_shard; converting to what the shards already are changes nothing and passes.
TEST_CASE("Module::to after fully_shard is refused at the call, naming fully_shard") {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::Linear>(6, 2)});
  fsdp::fully_shard(model->at<nn::Linear>(0));
  fsdp::fully_shard(model);
  const auto bias = to_vector(model->at<nn::Linear>(1)->bias);
  CHECK_THROWS_WITH(model->to(kFloat64), Catch::Contains("Sequential.to(f64)") && Catch::Contains("fsdp::fully_shard") &&
                                             Catch::Contains("before fully_shard"));
  // Linear 1 has no FSDP state of its own: its parameters are in the root's group.
  CHECK_THROWS_WITH(model->at<nn::Linear>(1)->to(kBFloat16),
                    Catch::Contains("Linear.to(bf16): parameter 'weight'") && Catch::Contains("'1.weight'"));
  CHECK_THROWS_WITH(model->to(Device::meta()), Catch::Contains("to(meta)") && Catch::Contains("fully_shard"));
  CHECK_NOTHROW(model->to(kFloat32));
  CHECK(model->at<nn::Linear>(1)->bias.dtype() == kFloat32);
  CHECK(to_vector(model->at<nn::Linear>(1)->bias) == bias);
  // Still whole: forward and backward run.
  sum((*model)(ones({2, 4}))).backward();
  CHECK(model->at<nn::Linear>(0)->weight.grad().defined());
}

// Between a forward that keeps its parameters gathered (reshard_after_forward false) and the backward, the module's
// parameters are the unsharded ones FSDP all-gathered into its own buffers: a conversion then would leave those behind
// too, so it is refused at the call, naming them; after the backward resharded, the shards' refusal speaks.
TEST_CASE("Module::to while fully_shard holds the unsharded parameters is refused, naming them") {
  manual_seed(4);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::Linear>(6, 2)});
  fsdp::fully_shard(model, {.reshard_after_forward = false});
  Tensor loss = sum((*model)(ones({2, 4})));
  CHECK_THROWS_WITH(model->to(kFloat64), Catch::Contains("Sequential.to(f64): parameter '0.weight' is the unsharded "
                                                         "form") && Catch::Contains("fsdp::fully_shard"));
  CHECK_THROWS_WITH(model->at<nn::Linear>(1)->to(Device::meta()), Catch::Contains("Linear.to(meta): parameter 'weight' "
                                                                                  "is the unsharded form"));
  CHECK(model->at<nn::Linear>(1)->bias.dtype() == kFloat32);
  loss.backward();  // the parameters are as they were: the backward runs and reshards
  CHECK(model->at<nn::Linear>(0)->weight.grad().defined());
  CHECK_THROWS_WITH(model->to(kFloat64), Catch::Contains("is a shard made by fsdp::fully_shard"));
}
