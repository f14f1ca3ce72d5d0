// FSDPModule's controls do what their names say: each test fails when its control is a no-op.
// set_requires_all_reduce (HSDP accumulation), set_reshard_after_forward, set_reshard_after_backward,
// set_unshard_in_backward, set_is_last_backward on a sub-module, gradient accumulation in the
// reduce dtype under mixed precision, MixedPrecisionPolicy::output_dtype, ranks whose sharded
// models issue different collectives, and the mistakes that used to train wrongly (an optimizer
// built before sharding, sharding top-down). Runs under mpirun at 1, 2 and 4 ranks.
// scripts/mutation_pass.sh turns each control into a no-op in turn and names the test that fails.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <filesystem>

#include "dist/dist.h"
#include "dist/flight_recorder.h"
#include "fsdp/fsdp.h"
#include "fsdp/state.h"
#include "weft.h"
#include "fsdp_test_models.h"

using namespace weft;
using namespace weft::fsdp_test;
using Catch::Contains;

namespace {

fsdp::FSDPModule shard_blocks(const std::shared_ptr<TinyGPT>& m, const fsdp::FullyShardOptions& o = {}) {
  for (auto& b : *m->blocks) fsdp::fully_shard(b, o);
  return fsdp::fully_shard(m, o);
}

bool any_reduce_scatter_pending(nn::Module& model) {
  for (auto& [name, m] : model.named_modules())
    if (auto s = fsdp::state_of(*m); s && s->group && s->group->reduce_scatter_pending()) return true;
  return false;
}

// The all-reduces across replicas (HSDP) in this rank's flight record, one entry per collective
// (its kind, sequence number, call and group: the line without its timings).
std::set<std::string> replica_all_reduces() {
  std::set<std::string> out;
  std::istringstream in(dist::flight_record());
  for (std::string line; std::getline(in, line);)
    if (line.find("across replicas") != std::string::npos) out.insert(line.substr(0, line.find(" ranks)")));
  return out;
}

size_t new_entries(const std::set<std::string>& before, const std::set<std::string>& after) {
  size_t n = 0;
  for (auto& e : after) n += !before.count(e);
  return n;
}

// Every parameter's gradient of the sharded model: the full tensor (gathered over the shard
// group; a collective on every rank), or nothing where no rank has one.
std::vector<std::pair<std::string, std::vector<double>>> full_grads(nn::Module& model, const fsdp::FSDPModule& root) {
  std::vector<std::pair<std::string, std::vector<double>>> out;
  for (auto& [name, p] : model.named_parameters())
    out.emplace_back(name, to_vector(root.gather_shard(name, p.grad().defined() ? p.grad() : zeros_like(p))));
  return out;
}

}  // namespace

namespace {

// HSDP with 2 replicas of world/2 shards ((2, 1) at 2 ranks, (2, 2) at 4); null, with the reason
// printed, at an odd world size.
std::shared_ptr<dist::DeviceMesh> two_replica_mesh() {
  const int world = dist::world_size();
  if (world < 2 || world % 2 != 0) {
    WARN("skipped: HSDP needs 2 replicas: an even world size; world size " << world);
    return nullptr;
  }
  return std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{2, world / 2});
}

}  // namespace

TEST_CASE("set_requires_all_reduce(false): no all-reduce, the sharded gradients wait unreduced") {
  auto mesh = two_replica_mesh();
  if (!mesh) return;
  auto ref = seeded<TinyGPT>(7);
  auto model = seeded<TinyGPT>(7);
  auto root = shard_blocks(model, {.mesh = mesh});
  const int groups = 3;
  Batch global = gpt_batch(0, 4);
  loss_of(*ref, global).backward();
  loss_of(*ref, global).backward();  // the reference: two backwards of the global batch, summed
  // Backward 1 without the all-reduce: every group reduce-scatters within its replica, none
  // all-reduces across replicas, and the sharded gradients are not written: the replica's
  // partial sum waits inside the group.
  root.set_requires_all_reduce(false);
  auto before = root.comm_stats();
  auto recorded = replica_all_reduces();
  loss_of(*model, slice(global)).backward();
  CHECK(root.comm_stats().reduce_scatters - before.reduce_scatters == groups);
  CHECK(root.comm_stats().all_reduces - before.all_reduces == 0);
  CHECK(new_entries(recorded, replica_all_reduces()) == 0);
  for (auto& [name, p] : model->named_parameters()) {
    INFO("parameter " << name);
    CHECK_FALSE(p.grad().defined());
  }
  // Backward 2 with it: one all-reduce per group carries both backwards' sums, averaged over
  // the replicas: the reference's gradients of the two backwards.
  root.set_requires_all_reduce(true);
  before = root.comm_stats();
  recorded = replica_all_reduces();
  loss_of(*model, slice(global)).backward();
  CHECK(root.comm_stats().all_reduces - before.all_reduces == groups);
  CHECK(new_entries(recorded, replica_all_reduces()) == size_t(groups));
  auto want = ref->named_parameters();
  auto got = full_grads(*model, root);
  for (size_t i = 0; i < want.size(); ++i)
    check_close(got[i].second, to_vector(want[i].second.grad()), 1e-5, "two backwards' gradient of " + got[i].first,
                1e-7);
}

TEST_CASE("set_requires_all_reduce(false): HSDP accumulation all-reduces on the later backward") {
  auto mesh = two_replica_mesh();
  if (!mesh) return;
  Parity<TinyGPT> run([&](const std::shared_ptr<TinyGPT>& m) { return shard_blocks(m, {.mesh = mesh}); });
  // Reduce-scatter only on the first micro-batch; the all-reduce of the last must carry it.
  run.train(gpt_batch, 4, 3, 2, {.before_forward = [&](int, int m) { run.root.set_requires_all_reduce(m == 1); }});
  // Every rank compares its replica with the reference: replicas that diverged fail here.
  run.check_params(1e-5, "HSDP accumulation");
}

TEST_CASE("set_reshard_after_backward(false): the next forward gathers nothing") {
  Parity<TinyGPT> run([](const std::shared_ptr<TinyGPT>& m) { return shard_blocks(m); });
  const int groups = 3;
  fsdp::CommStats before;
  run.train(gpt_batch, 4, 2, 2,
            {.before_forward =
                 [&](int, int m) {
                   bool last = m == 1;
                   run.root.set_requires_gradient_sync(last);
                   run.root.set_reshard_after_backward(last);
                   before = run.root.comm_stats();
                 },
             .before_backward =
                 [&](int step, int m) {
                   // The first micro-batch of a step gathers every group; the second finds them unsharded.
                   INFO("step " << step << " micro-batch " << m);
                   CHECK(run.root.comm_stats().all_gathers - before.all_gathers == (m == 0 ? groups : 0));
                 }});
  run.check_params(1e-5, "accumulation without resharding");
}

TEST_CASE("set_reshard_after_forward: the groups left gathered after forward, and the backward's all-gathers") {
  using S = fsdp::FSDPParamGroup::State;
  auto ref = seeded<TinyGPT>(7);
  auto model = seeded<TinyGPT>(7);
  auto root = shard_blocks(model);
  auto block = [&](int i) { return fsdp::state_of(*model->blocks->at<nn::Block>(size_t(i)))->group->state(); };
  auto own = [&] { return root.state()->group->state(); };
  Batch global = gpt_batch(0, 4);
  loss_of(*ref, global).backward();
  // Each setting, then what a forward leaves gathered and how many all-gathers its backward
  // issues (3 groups: the two blocks and the root's own parameters).
  struct Case {
    const char* what;
    std::function<void()> set;
    bool blocks_gathered, root_gathered;
    int backward_all_gathers;
  };
  const std::vector<Case> cases{
      {"default: the blocks reshard, the root keeps its parameters", [] {}, false, true, 2},
      {"false, recursive", [&] { root.set_reshard_after_forward(false); }, true, true, 0},
      {"true, recursive", [&] { root.set_reshard_after_forward(true); }, false, false, 3},
      {"false on the root only", [&] { root.set_reshard_after_forward(false, /*recurse=*/false); }, false, true, 2},
  };
  for (auto& c : cases) {
    INFO(c.what);
    c.set();
    for (auto& p : model->parameters()) p.set_grad(Tensor());
    Tensor l = loss_of(*model, slice(global));
    CHECK((block(0) == S::unsharded) == c.blocks_gathered);
    CHECK((block(1) == S::unsharded) == c.blocks_gathered);
    CHECK((own() == S::unsharded) == c.root_gathered);
    auto before = root.comm_stats();
    l.backward();
    CHECK(root.comm_stats().all_gathers - before.all_gathers == c.backward_all_gathers);
    auto want = ref->named_parameters();
    auto got = full_grads(*model, root);
    for (size_t i = 0; i < want.size(); ++i)
      check_close(got[i].second, to_vector(want[i].second.grad()), 1e-5, std::string(c.what) + ": gradient of " +
                  got[i].first, 1e-7);
  }
}

TEST_CASE("set_unshard_in_backward(false): the module is not gathered in backward, prefetch included") {
  std::optional<fsdp::FSDPModule> wte;
  Parity<TinyGPT> run([&](const std::shared_ptr<TinyGPT>& m) {
    // The embedding needs no weights in its backward (the gradient scatters by index).
    wte = fsdp::fully_shard(m->wte);
    wte->set_unshard_in_backward(false);
    return shard_blocks(m);
  });
  fsdp::CommStats before, wte_before;
  run.train(gpt_batch, 4, 3, 1,
            {.before_backward =
                 [&](int, int) {
                   before = run.root.comm_stats();
                   wte_before = wte->comm_stats();
                 },
             .after_backward =
                 [&](int, int) {
                   // The two blocks are gathered again (the root kept its parameters); the embedding is
                   // not, though it comes next in the reverse order that block 0's prefetch follows.
                   CHECK(run.root.comm_stats().all_gathers - before.all_gathers == 2);
                   CHECK(wte->comm_stats().all_gathers == wte_before.all_gathers);
                   CHECK(wte->comm_stats().reduce_scatters == wte_before.reduce_scatters + 1);
                 }});
  run.check_params(1e-5, "embedding not gathered in backward");
}

TEST_CASE("set_is_last_backward on a sub-module sets the whole step's") {
  for (bool before_first_forward : {true, false}) {
    INFO("set before the first forward: " << before_first_forward);
    manual_seed(7);
    auto model = std::make_shared<TinyGPT>();
    auto root = shard_blocks(model);
    auto block0 = *fsdp::fsdp_module(*model->blocks->at<nn::Block>(0));
    auto block1 = *fsdp::fsdp_module(*model->blocks->at<nn::Block>(1));
    if (!before_first_forward) {
      loss_of(*model, slice(gpt_batch(0, 4))).backward();
      CHECK_FALSE(any_reduce_scatter_pending(*model));
    }
    block0.set_is_last_backward(false);
    loss_of(*model, slice(gpt_batch(1, 4))).backward();
    // Not the last backward: the last reduce-scatter is left in flight (finished by the next
    // backward or forward).
    CHECK(any_reduce_scatter_pending(*model));
    block1.set_is_last_backward(true);
    loss_of(*model, slice(gpt_batch(2, 4))).backward();
    CHECK_FALSE(any_reduce_scatter_pending(*model));
  }
}

TEST_CASE("accumulation without sync under mixed precision keeps gradients in the reduce dtype") {
  // bf16 parameters, f32 reduction. Syncing every micro-batch sums f32 reduce-scatter outputs;
  // syncing only the last must accumulate the unsharded bf16 gradients in f32, so both agree to
  // f32 rounding. Accumulating in bf16 would differ by ~1e-2 relative.
  fsdp::FullyShardOptions o{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}};
  auto build = [&] {
    manual_seed(11);
    auto m = std::make_shared<UnevenMLP>();
    fsdp::fully_shard(m->fc1, o);
    fsdp::fully_shard(m->fc2, o);
    return std::make_pair(m, fsdp::fully_shard(m, o));
  };
  auto [every, every_root] = build();
  auto [last, last_root] = build();
  const int micro = 8;
  for (int m = 0; m < micro; ++m) {
    Batch b = slice(mlp_batch(m, 8));
    every_root.set_requires_gradient_sync(true);
    (loss_of(*every, b) * (1.0 / micro)).backward();
    last_root.set_requires_gradient_sync(m == micro - 1);
    (loss_of(*last, b) * (1.0 / micro)).backward();
  }
  auto want = every->named_parameters(), got = last->named_parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    REQUIRE(got[i].second.grad().defined() == want[i].second.grad().defined());
    if (!want[i].second.grad().defined() || want[i].second.numel() == 0) continue;  // an empty shard
    CHECK(got[i].second.grad().dtype() == DType::f32);
    check_close(to_vector(got[i].second.grad()), to_vector(want[i].second.grad()), 1e-4,
                "accumulated gradient of " + want[i].first, 1e-7);
  }
}

TEST_CASE("an optimizer built before fully_shard is refused at its first step, naming the parameter") {
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  nn::AdamW early(m->parameters(), {.lr = 1e-2});
  fsdp::fully_shard(m->fc1);
  fsdp::fully_shard(m);
  loss_of(*m, slice(mlp_batch(0, 8))).backward();
  CHECK_THROWS_WITH(early.step(), Contains("AdamW::step: parameter 0") && Contains("fully_shard") &&
                                      Contains("'weight'") && Contains("build it after sharding"));
  nn::AdamW late(m->parameters(), {.lr = 1e-2});
  CHECK_NOTHROW(late.step());
}

TEST_CASE("sharding a module after the module that contains it is refused: bottom-up") {
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  fsdp::fully_shard(m);
  CHECK_THROWS_WITH(fsdp::fully_shard(m->fc1), Contains("bottom-up") && Contains("'fc1.weight'"));
}

namespace {
// A language model whose head is tied to its embedding: one tensor under two names.
struct TiedLM : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> head;
  TiedLM() : nn::Module("TiedLM") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(11, 12));
    head = register_module("head", std::make_shared<nn::Linear>(12, 11, false));
    head->parameter_slot("weight") = wte->weight;
  }
  Tensor forward(const Tensor& idx) override { return (*head)((*wte)(idx)); }
  using nn::Module::forward;
};
}  // namespace

TEST_CASE("tied parameters in every state-dict path") {
  Parity<TiedLM> run([](const std::shared_ptr<TiedLM>& m) { return fsdp::fully_shard(m); }, 5);
  run.train(gpt_batch, 4, 2);
  auto& model = run.model;
  auto& root = run.root;
  auto& opt = run.opt;
  const auto want = to_vector(run.ref->wte->weight);
  // full_tensor under either name.
  check_close(to_vector(root.full_tensor("wte.weight")), want, 1e-5, "full_tensor(wte.weight)");
  check_close(to_vector(root.full_tensor("head.weight")), want, 1e-5, "full_tensor(head.weight)");
  // The full state dict holds both names, as the unsharded model's state_dict() does.
  for (bool rank0_only : {false, true}) {
    auto full = fsdp::full_state_dict(*model, &root, {.rank0_only = rank0_only});
    if (rank0_only && dist::rank() != 0) {
      CHECK(full.empty());
      continue;
    }
    std::vector<std::string> names;
    for (auto& [k, t] : full) names.push_back(k);
    CHECK(names == std::vector<std::string>{"wte.weight", "head.weight"});
    for (auto& [k, t] : full) check_close(to_vector(t), want, 1e-5, "full state dict " + k);
    // A strict load into the unsharded model takes it.
    auto plain = std::make_shared<TiedLM>();
    plain->load_state_dict(full);
    check_close(to_vector(plain->head->weight), want, 1e-5, "unsharded model loaded from the full state dict");
  }
  // Load full into sharded: both names given, equal values.
  auto full = fsdp::full_state_dict(*model, &root);
  manual_seed(99);
  auto other = std::make_shared<TiedLM>();
  auto other_root = fsdp::fully_shard(other);
  fsdp::load_full_state_dict(*other, full, &other_root);
  check_close(to_vector(other_root.full_tensor("head.weight")), want, 1e-5, "loaded into a sharded model");
  // A sharded checkpoint: loads back into a sharded model, and its consolidated file holds every
  // name a strict load of the unsharded model expects.
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "weft_tied_ckpt";
  if (dist::rank() == 0) fs::remove_all(dir);
  dist::world()->barrier()->wait();
  fsdp::save_checkpoint(dir.string(), *model, &opt, &root, {.step = 2});
  manual_seed(98);
  auto again = std::make_shared<TiedLM>();
  auto again_root = fsdp::fully_shard(again);
  fsdp::load_checkpoint(dir.string(), *again, nullptr, &again_root);
  check_close(to_vector(again_root.full_tensor("head.weight")), want, 1e-5, "loaded from the checkpoint");
  if (dist::rank() == 0) {
    fsdp::consolidate_checkpoint(dir.string(), (dir / "model.safetensors").string());
    auto file = load_safetensors((dir / "model.safetensors").string());
    auto plain = std::make_shared<TiedLM>();
    plain->load_state_dict(file.tensors);
    check_close(to_vector(plain->head->weight), want, 1e-5, "unsharded model loaded from the consolidated file");
  }
  dist::world()->barrier()->wait();
  if (dist::rank() == 0) fs::remove_all(dir);
}

namespace {
// What `run` writes to stderr.
std::string stderr_of(const std::function<void()>& run) {
  std::fflush(stderr);
  char path[] = "/tmp/weft_warn_XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  int saved = dup(2);
  dup2(fd, 2);
  run();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  return text.str();
}
}  // namespace

// Before the next test: the warning is printed once per process.
TEST_CASE("a backward that threw leaves no root behind for the next backward's warning") {
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  fsdp::fully_shard(m);
  Tensor out = (*m)(slice(mlp_batch(0, 8)).x);
  out.register_hook([](const Tensor&) -> Tensor { throw std::runtime_error("hook failure"); });
  CHECK_THROWS_WITH(sum(out).backward(), Contains("hook failure"));
  CHECK_THAT(stderr_of([&] { loss_of(*m, slice(mlp_batch(1, 8))).backward(); }),
             !Contains("separately sharded modules"));
}

TEST_CASE("an unsharded parent of sharded modules is warned about") {
  // Only the layers are sharded: each is a root, and the model's own parameters (none here, a
  // model with a head of its own would drift) are not synchronized. FSDP2 allows it; weft warns.
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  fsdp::fully_shard(m->fc1);
  fsdp::fully_shard(m->fc2);
  CHECK_THAT(stderr_of([&] { loss_of(*m, slice(mlp_batch(0, 8))).backward(); }),
             Contains("fsdp: warning: one backward ran through 2 separately sharded modules") &&
                 Contains("Call fully_shard on the whole model last"));
}

namespace {
// nanoGPT's tying by reading: the head is the embedding's weight, read by the parent's forward.
struct ReadsChildWeight : nn::Module {
  std::shared_ptr<nn::Embedding> wte = register_module("wte", std::make_shared<nn::Embedding>(8, 4));
  std::shared_ptr<nn::Linear> mid = register_module("mid", std::make_shared<nn::Linear>(4, 4));
  ReadsChildWeight() : nn::Module("ReadsChildWeight") {}
  Tensor forward(const Tensor& idx) override { return linear(tanh((*mid)((*wte)(idx))), wte->weight); }
  using nn::Module::forward;
};
}  // namespace

// With wte sharded apart, the parent read this rank's shard (logits [4, 8 / P], a gradient that skipped the
// reduce-scatter), where FSDP2 fails on mixing a DTensor with a tensor: the backward reaching the shard says so.
// After the warning's tests: a backward stopped here may print the once-a-process warning.
TEST_CASE("a forward that reads a separately sharded child's parameter is refused at its backward") {
  manual_seed(1);
  auto m = std::make_shared<ReadsChildWeight>();
  fsdp::fully_shard(m->wte);
  fsdp::fully_shard(m);
  const Tensor idx = from_vector({1, 2, 3, 0}, {4}, {.dtype = kInt64});
  CHECK_THROWS_WITH(sum((*m)(idx)).backward(),
                    Contains("a backward reached the shard of weight") && Contains("outside the call of the module"));
  // Sharded in one group, the same model trains.
  manual_seed(1);
  auto one = std::make_shared<ReadsChildWeight>();
  fsdp::fully_shard(one);
  CHECK_NOTHROW(sum((*one)(idx)).backward());
}

TEST_CASE("activation checkpointing composes with fully_shard: parity, either order") {
  for (bool checkpoint_first : {true, false}) {
    INFO("checkpointing turned on " << (checkpoint_first ? "before" : "after") << " sharding");
    int recomputes = 0;
    Parity<TinyGPT> run([&](const std::shared_ptr<TinyGPT>& model) {
      for (auto& b : *model->blocks) {
        if (checkpoint_first) b->set_activation_checkpointing(true);
        // A child's hooks run in forward and again in the recompute.
        std::static_pointer_cast<nn::Block>(b)->mlp->register_forward_hook(
            [&](nn::Module&, const nn::TensorList&, const nn::TensorList&) {
              ++recomputes;
              return std::optional<nn::TensorList>();
            });
      }
      auto root = shard_blocks(model);
      if (!checkpoint_first)
        for (auto& b : *model->blocks) b->set_activation_checkpointing(true);
      return root;
    });
    run.train(gpt_batch, 4, 3);
    CHECK(recomputes == 3 * 2 * 2);  // 3 steps x 2 blocks x (forward + recompute)
    run.check_params(1e-5, "activation checkpointing");
  }
}

TEST_CASE("no gather outlives the step: checkpointed blocks of sharded parts, a skipping no-grad forward, a late wait") {
  // Blocks checkpointed whole, their attention and MLP sharded on their own: the recompute in the backward had
  // prefetched the next (already backwarded) group, whose gather then held the weights from before the step.
  Parity<TinyGPT> parts([](const std::shared_ptr<TinyGPT>& model) {
    for (auto& b : *model->blocks) {
      auto block = std::static_pointer_cast<nn::Block>(b);
      fsdp::fully_shard(block->attn);
      fsdp::fully_shard(block->mlp);
      b->set_activation_checkpointing(true);
    }
    return fsdp::fully_shard(model);
  });
  parts.train(gpt_batch, 4, 4);
  parts.check_params(1e-5, "checkpointed blocks of sharded parts");
  // A forward without gradients between the backward and the step that skips block 1 (which block 0 prefetched).
  Parity<TinyGPT> skip([](const std::shared_ptr<TinyGPT>& model) { return shard_blocks(model); });
  auto skipping = [&](const nn::TensorList& in) {
    TinyGPT& m = *skip.model;
    return nn::TensorList{(*m.head)((*m.ln_f)((*m.blocks->at<nn::Block>(0))((*m.wte)(in[0]))))};
  };
  skip.train(gpt_batch, 4, 4, 1, {.after_backward = [&](int, int) {
    NoGradGuard no_grad;
    skip.model->call(skipping, {gpt_batch(0).x});
    // Sharded again whether or not its gather, started before the step, would complete in time to read the old shard.
    CHECK(fsdp::state_of(*skip.model->blocks->at<nn::Block>(1))->group->state() == fsdp::FSDPParamGroup::State::sharded);
  }});
  skip.check_params(1e-5, "a no-grad forward skipping a block");
  // UnshardHandle::wait() after the forward used the gather: nothing to wait for (it had gathered again).
  Parity<TinyGPT> late([](const std::shared_ptr<TinyGPT>& model) { return shard_blocks(model); });
  std::optional<fsdp::FSDPModule::UnshardHandle> handle;
  late.train(gpt_batch, 4, 3, 1, {.before_forward = [&](int, int) {
    handle = fsdp::fsdp_module(*late.model->blocks->at<nn::Block>(1))->unshard(true);
  }, .after_backward = [&](int, int) { handle->wait(); }});
  late.check_params(1e-5, "a wait after the backward");
}

TEST_CASE("Module::call runs any method of a sharded module inside its forward hooks") {
  manual_seed(3);
  auto ref = std::make_shared<UnevenMLP>();
  manual_seed(3);
  auto m = std::make_shared<UnevenMLP>();
  fsdp::fully_shard(m);
  Tensor x = randn({2, 7});
  // A method other than forward that reads the parameters directly: without the hooks it
  // would see this rank's shards.
  auto method = [&](const nn::TensorList& in) {
    return nn::TensorList{matmul(in[0], m->fc1->weight.transpose(0, 1))};
  };
  NoGradGuard no_grad;  // e.g. sampling: afterwards the parameters are shards again
  Tensor got = m->call(method, {x})[0];
  Tensor want = matmul(x, ref->fc1->weight.transpose(0, 1));
  check_close(to_vector(got), to_vector(want), 1e-6, "a method run through call()");
  CHECK(m->fc1->weight.shape() == fsdp::fsdp_module(*m)->state()->group->params()[0]->sharded().shape());
  // A method that calls the module itself (a sampling loop): the inner calls run on the outer call's gather (the
  // inner root forward had reset the outer one, which then failed its post-forward).
  auto again = [](nn::Module& mod, const Tensor& in) {
    const Tensor y = mod(in);  // [2, 3] -> [2, 7], the input's width
    return mod(cat({y, y, y.narrow(1, 0, 1)}, 1));
  };
  Tensor t = m->call([&](const nn::TensorList& in) { return nn::TensorList{again(*m, in[0])}; }, {x})[0];
  Tensor r = again(*ref, x);
  check_close(to_vector(t), to_vector(r), 1e-6, "a method calling the module twice");
}

TEST_CASE("SummonFullParams: recurse and offload_to_cpu") {
  manual_seed(7);
  auto ref = std::make_shared<TinyGPT>();
  manual_seed(7);
  auto model = std::make_shared<TinyGPT>();
  auto root = shard_blocks(model);
  auto block_w = [&] { return model->blocks->at<nn::Block>(0)->mlp->c_fc->weight; };
  const Shape shard_shape = block_w().shape();
  {
    fsdp::SummonFullParams own(root, {.recurse = false});
    CHECK(model->head->weight.shape() == ref->head->weight.shape());
    CHECK(to_vector(model->head->weight) == to_vector(ref->head->weight));
    CHECK(block_w().shape() == shard_shape);  // the blocks' groups are not summoned
  }
  {
    // offload_to_cpu moves full tensors gathered on a device to the host. A CPU group's full
    // tensors are host tensors already, so on the CPU the option has no effect to observe (the
    // CUDA suite, fsdp_cuda, checks the move); here: the full tensors are host memory of their
    // own, not views of the group's shard or gather buffers, and their bytes are live on the
    // host only while summoned.
    const int64_t live_before = memory_stats(kCPU).live_bytes;
    auto summoned = std::make_unique<fsdp::SummonFullParams>(root, fsdp::SummonOptions{.offload_to_cpu = true});
    const Tensor full = block_w();
    CHECK(full.shape() == ref->blocks->at<nn::Block>(0)->mlp->c_fc->weight.shape());
    CHECK(full.device().is_cpu());
    auto& group = *fsdp::state_of(*model->blocks->at<nn::Block>(0))->group;
    CHECK(group.state() == fsdp::FSDPParamGroup::State::sharded);  // the group itself was not gathered
    CHECK(full.data_ptr() != group.flat_shard().data_ptr());
    CHECK(memory_stats(kCPU).live_bytes - live_before >= full.numel() * int64_t(sizeof(float)));
    {
      NoGradGuard no_grad;
      block_w().fill_(0.25);
    }
    summoned.reset();
  }
  CHECK(block_w().shape() == shard_shape);
  for (double v : to_vector(root.full_tensor("blocks.0.mlp.c_fc.weight"))) REQUIRE(v == 0.25);
}

TEST_CASE("prefetch: the next group's all-gather is in flight before the current module computes") {
  using S = fsdp::FSDPParamGroup::State;
  manual_seed(3);
  auto seq = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 4; ++i) seq->push_back(std::make_shared<nn::Linear>(8, 8));
  std::vector<fsdp::FSDPModule> blocks;
  for (size_t i = 0; i < 4; ++i) blocks.push_back(fsdp::fully_shard((*seq)[i]));
  fsdp::fully_shard(seq);
  auto state = [&](size_t i) { return fsdp::state_of(*(*seq)[i])->group->state(); };
  auto prefetched = [&](size_t i) { return state(i) == S::gathering || state(i) == S::unsharded; };
  // Observed from hooks registered after fully_shard's: they run after its pre-forward (the
  // module's own group gathered, the prefetch issued) and after its pre-backward.
  std::vector<std::vector<bool>> fwd(4), bwd(4);  // per block: which groups were prefetched then
  for (size_t i = 0; i < 4; ++i) {
    (*seq)[i]->register_forward_pre_hook([&, i](nn::Module&, const nn::TensorList&) {
      for (size_t j = 0; j < 4; ++j) fwd[i].push_back(j != i && prefetched(j));
      return std::optional<nn::TensorList>();
    });
    (*seq)[i]->register_forward_hook([&, i](nn::Module&, const nn::TensorList&, const nn::TensorList& out) {
      out[0].register_hook([&, i](const Tensor&) {
        for (size_t j = 0; j < 4; ++j) bwd[i].push_back(j != i && prefetched(j));
        return Tensor();
      });
      return std::optional<nn::TensorList>();
    });
  }
  auto step = [&] {
    for (auto& v : fwd) v.clear();
    for (auto& v : bwd) v.clear();
    sum((*seq)(randn({2, 8}))).backward();
  };
  step();  // the first forward records the order; later ones prefetch along it
  step();
  using V = std::vector<bool>;
  // Implicit: forward gathers the next block ahead, backward the previous one.
  CHECK(fwd[0] == V{false, true, false, false});
  CHECK(fwd[2] == V{false, false, false, true});
  CHECK(bwd[3] == V{false, false, true, false});
  CHECK(bwd[1] == V{true, false, false, false});
  // Explicit targets replace the implicit ones.
  blocks[0].set_modules_to_forward_prefetch({blocks[2]});
  blocks[3].set_modules_to_backward_prefetch({blocks[1]});
  step();
  CHECK(fwd[0] == V{false, false, true, false});
  CHECK(bwd[3] == V{false, true, false, false});
}

TEST_CASE("mixed precision is numerically bf16: close to f32, and not equal to it") {
  manual_seed(7);
  auto ref = std::make_shared<TinyGPT>();
  manual_seed(7);
  auto model = std::make_shared<TinyGPT>();
  // Blocks pass bf16 on; the root's output (the logits) comes back in f32.
  fsdp::FullyShardOptions o{.mp_policy = {.param_dtype = DType::bf16, .reduce_dtype = DType::f32}};
  for (auto& b : *model->blocks) fsdp::fully_shard(b, o);
  o.mp_policy.output_dtype = DType::f32;
  auto root = fsdp::fully_shard(model, o);
  Batch global = gpt_batch(0, 4);
  Tensor ref_loss = loss_of(*ref, global);
  ref_loss.backward();
  Tensor l = loss_of(*model, slice(global));
  l.backward();
  double got = global_mean(l.item()), want = ref_loss.item();
  INFO("loss: bf16 " << got << ", f32 " << want);
  CHECK(std::abs(got - want) <= 1e-2 * std::abs(want));  // bf16 keeps 8 bits of mantissa
  CHECK(std::abs(got - want) > 1e-5 * std::abs(want));    // it did compute in bf16 (f32 parity: < 1e-6)
  // Gradients (f32 shards, reduced in f32) within a relative 3e-2 in norm of the f32 ones.
  double err = 0, norm = 0;
  for (auto& [name, p] : model->named_parameters()) {
    // A collective for every parameter on every rank, whatever this rank's shard holds.
    Tensor g = root.gather_shard(name, p.grad().defined() ? p.grad() : zeros_like(p));
    Tensor w;
    for (auto& [rn, rp] : ref->named_parameters())
      if (rn == name) w = rp.grad();
    auto a = to_vector(g), b = to_vector(w);
    for (size_t i = 0; i < a.size(); ++i) err += (a[i] - b[i]) * (a[i] - b[i]), norm += b[i] * b[i];
  }
  INFO("relative gradient error " << std::sqrt(err / norm));
  CHECK(std::sqrt(err / norm) <= 3e-2);
  CHECK(std::sqrt(err / norm) > 1e-4);  // bf16, not f32 (f32 parity: ~1e-7)
}

TEST_CASE("cast_forward_inputs = false leaves the inputs' dtype to the module") {
  struct CastAware : nn::Module {
    std::shared_ptr<nn::Linear> fc;
    DType seen = DType::f32;
    CastAware() : nn::Module("CastAware") { fc = register_module("fc", std::make_shared<nn::Linear>(4, 4)); }
    Tensor forward(const Tensor& x) override {
      seen = x.dtype();
      return (*fc)(x.to(fc->weight.dtype()));
    }
    using nn::Module::forward;
  };
  for (bool cast : {true, false}) {
    manual_seed(1);
    auto m = std::make_shared<CastAware>();
    fsdp::fully_shard(m, {.mp_policy = {.param_dtype = DType::bf16, .cast_forward_inputs = cast}});
    Tensor y = (*m)(randn({2, 4}));
    CHECK(m->seen == (cast ? DType::bf16 : DType::f32));
    CHECK(y.dtype() == DType::bf16);
  }
}

TEST_CASE("set_reduce_scatter_divide_factor: sum, then divide by the factor") {
  auto grads = [](double factor) {
    manual_seed(3);
    auto m = std::make_shared<UnevenMLP>();
    fsdp::fully_shard(m->fc1);
    auto root = fsdp::fully_shard(m);
    if (factor > 0) root.set_reduce_scatter_divide_factor(factor);
    loss_of(*m, slice(mlp_batch(0, 8))).backward();
    std::vector<double> out;
    for (auto& p : m->parameters())
      if (p.grad().defined())
        for (double v : to_vector(p.grad())) out.push_back(v);
    return out;
  };
  auto avg = grads(0), summed = grads(1.0), half = grads(2.0);
  const double n = dist::world_size();
  std::vector<double> want_sum, want_half;
  for (double v : avg) want_sum.push_back(v * n), want_half.push_back(v * n / 2);
  check_close(summed, want_sum, 1e-5, "factor 1: the sum over ranks");
  check_close(half, want_half, 1e-5, "factor 2: the sum over ranks, halved");
  auto model = std::make_shared<UnevenMLP>();
  auto root = fsdp::fully_shard(model);  // infinity had made every gradient -0
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL})
    CHECK_THROWS_WITH(root.set_reduce_scatter_divide_factor(bad), Contains("factor must be a finite number > 0"));
}

TEST_CASE("an FSDPModule used after its module is gone is an error naming that, not a crash") {
  fsdp::FSDPModule handle = fsdp::fully_shard(std::make_shared<UnevenMLP>());  // the module dies with the temporary
  const auto gone = Contains("the module fully_shard was applied to has been destroyed");
  CHECK_THROWS_WITH(handle.full_tensor("fc1.weight"), gone);  // had read freed memory (a segfault)
  CHECK_THROWS_WITH(handle.module(), gone);
  CHECK_THROWS_WITH(handle.set_requires_gradient_sync(false), gone);
}

TEST_CASE("MixedPrecisionPolicy::output_dtype: the module returns it, with the values of the computation") {
  SECTION("f32 parameters, f64 outputs") {
    auto ref = seeded<UnevenMLP>(3);
    auto model = seeded<UnevenMLP>(3);
    fsdp::fully_shard(model->fc1);
    auto root = fsdp::fully_shard(model, {.mp_policy = {.output_dtype = DType::f64}});
    Batch global = mlp_batch(0, 8);
    Tensor y = (*model)(slice(global).x);  // the module's own output: no cast here
    CHECK(y.dtype() == DType::f64);
    {
      NoGradGuard no_grad;
      check_close(to_vector(y), to_vector((*ref)(slice(global).x)), 1e-6, "f64 outputs");
    }
    // The cast is part of the graph: the f32 shards get the reference's gradients (each rank's
    // mean over its slice, averaged over the ranks: the mean over the global batch).
    mean(y).backward();
    mean((*ref)(global.x)).backward();
    auto want = ref->named_parameters();
    auto got = full_grads(*model, root);
    for (size_t i = 0; i < want.size(); ++i)
      check_close(got[i].second, to_vector(want[i].second.grad()), 1e-5, "gradient of " + got[i].first, 1e-7);
    for (auto& [name, p] : model->named_parameters())
      if (p.grad().defined()) CHECK(p.grad().dtype() == DType::f32);
  }
  SECTION("bf16 compute, f32 logits") {
    auto ref = seeded<TinyGPT>(7);
    fsdp::MixedPrecisionPolicy bf16{.param_dtype = DType::bf16, .reduce_dtype = DType::f32};
    auto build = [&](std::optional<DType> output_dtype) {
      auto m = seeded<TinyGPT>(7);
      for (auto& b : *m->blocks) fsdp::fully_shard(b, {.mp_policy = bf16});  // blocks pass bf16 on
      auto root_policy = bf16;
      root_policy.output_dtype = output_dtype;
      fsdp::fully_shard(m, {.mp_policy = root_policy});
      return m;
    };
    auto with = build(DType::f32), without = build(std::nullopt);
    Batch b = slice(gpt_batch(0, 4));
    NoGradGuard no_grad;
    Tensor logits = (*with)(b.x);
    CHECK(logits.dtype() == DType::f32);
    CHECK((*without)(b.x).dtype() == DType::bf16);  // the head's own dtype
    auto got = to_vector(logits), want = to_vector((*ref)(b.x));
    double err = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) err += (got[i] - want[i]) * (got[i] - want[i]), norm += want[i] * want[i];
    INFO("relative error of the logits computed in bf16: " << std::sqrt(err / norm));
    CHECK(std::sqrt(err / norm) <= 2e-2);
    CHECK(std::sqrt(err / norm) > 1e-5);  // computed in bf16 and cast, not computed in f32
  }
}

TEST_CASE("ranks whose sharded models issue different collectives all fail, naming the calls") {
  const int world = dist::world_size();
  if (world < 2) {
    WARN("a mismatch between ranks needs 2 ranks; world size 1: nothing to compare");
    return;
  }
  // The same parameters on every rank (names, shapes, dtypes: fully_shard's check of the model
  // across ranks passes), but the last rank gathers in bf16: its all-gather sends half the bytes
  // the others expect. Without the collective fingerprint check MPI would write past the smaller
  // buffers or wait forever; with it every rank raises the same named error before any buffer
  // is touched, and the world stays usable.
  auto model = seeded<UnevenMLP>(3);
  fsdp::FullyShardOptions o;
  if (dist::rank() == world - 1) o.mp_policy.param_dtype = DType::bf16;
  fsdp::fully_shard(model->fc1, o);
  fsdp::fully_shard(model->fc2, o);
  fsdp::fully_shard(model, o);
  CHECK_THROWS_WITH(loss_of(*model, slice(mlp_batch(0, 8))),
                    Contains("issue different collectives") && Contains("all_gather") && Contains("bf16") &&
                        Contains("f32") && Contains("fsdp 'fc1' FORWARD"));
  Tensor one = ones({1});
  dist::world()->all_reduce(one)->wait();
  CHECK(one.item() == world);
}

// After a mismatch every rank catches, the sharded model trains on: the group whose all-gather every rank skipped is
// sharded again (it had kept the failed gather and thrown the old error at every later forward on that rank alone,
// so the ranks fell out of step until the collective timeout).
TEST_CASE("a sharded model trains on after a collective mismatch that every rank caught") {
  if (dist::world_size() < 2) {
    WARN("a mismatch between ranks needs 2 ranks; world size 1: nothing to compare");
    return;
  }
  auto model = seeded<UnevenMLP>(3);
  fsdp::FSDPModule fc1 = fsdp::fully_shard(model->fc1);
  fsdp::fully_shard(model->fc2);
  fsdp::FSDPModule root = fsdp::fully_shard(model);
  auto step = [&] { return loss_of(*model, slice(mlp_batch(0, 8))); };
  auto mismatch = [&] {
    if (dist::rank() == 0) fc1.unshard(), fc1.reshard();  // one rank only: the others do not
    return step();
  };
  // At the first forward (its check across ranks fails too: the root initialises again at the next one), then later.
  CHECK_THROWS_WITH(mismatch(), Contains("issue different collectives"));
  const double before = step().item();
  CHECK_THROWS_WITH(([&] {
                      if (dist::rank() == 0) fc1.unshard(), fc1.reshard();  // one rank only: the others do not
                      return step();
                    }()),
                    Contains("issue different collectives"));
  for (int i = 0; i < 2; ++i) {  // the same weights and rows: the loss of before
    double loss = 0;
    CHECK_NOTHROW(loss = step().item());
    CHECK(loss == before);
  }
}
