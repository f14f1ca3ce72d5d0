// FSDP state dicts and checkpoints at 1, 2 and 4 ranks: sharded round trips without
// communication, full state dicts against the single-process model, the optimizer's state by
// name, checkpoints resharded N -> M for every pair of shard counts the world allows,
// consolidation, exact resume, retention, and clear errors for corrupt or foreign checkpoints.
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/allocator.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "fsdp/checkpoint_index.h"
#include "fsdp/fsdp.h"
#include "fsdp_test_models.h"
#include "shared_dir.h"

using namespace weft;
using namespace weft::fsdp_test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

using weft::test::shared_dir;

void barrier() { dist::world()->barrier()->wait(); }

// Bitwise equality of two named lists (same keys in the same order), naming the first difference.
void check_same(const nn::NamedTensorList& got, const nn::NamedTensorList& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what << ": entry " << i << " \"" << got[i].first << "\" vs \"" << want[i].first << "\"");
    REQUIRE(got[i].first == want[i].first);
    REQUIRE(got[i].second.shape() == want[i].second.shape());
    auto a = to_vector(got[i].second), b = to_vector(want[i].second);
    size_t bad = 0;
    while (bad < a.size() && a[bad] == b[bad]) ++bad;
    INFO("first difference at element " << bad << ": " << (bad < a.size() ? a[bad] : 0.0) << " vs "
                                        << (bad < b.size() ? b[bad] : 0.0));
    CHECK(bad == a.size());
  }
}

nn::NamedTensorList clone_all(const nn::NamedTensorList& l) {
  nn::NamedTensorList out;
  for (auto& [k, t] : l) out.emplace_back(k, t.clone());
  return out;
}

// The models under test, sharded per child (one group each) then at the root.
template <class M>
std::pair<std::shared_ptr<M>, fsdp::FSDPModule> make_sharded(uint64_t seed,
                                                             std::shared_ptr<dist::DeviceMesh> mesh = nullptr) {
  manual_seed(seed);
  auto m = std::make_shared<M>();
  for (auto& [name, child] : m->named_children())
    if (!child->parameters().empty() && name != "blocks") fsdp::fully_shard(child, {.mesh = mesh});
  if constexpr (std::is_same_v<M, TinyGPT>)
    for (auto& b : *m->blocks) fsdp::fully_shard(b, {.mesh = mesh});
  auto root = fsdp::fully_shard(m, {.mesh = mesh});
  return {m, root};
}

Batch batch_for(const nn::Module& m, int step) {
  return m.type_name() == "UnevenMLP" ? mlp_batch(step, 8) : gpt_batch(step, 4);
}

// Trains steps [first, first + steps) on this rank's slice of each global batch.
void train(nn::Module& m, nn::Optimizer& opt, int first, int steps, std::vector<double>* losses = nullptr,
           nn::LRScheduler* sched = nullptr) {
  for (int s = first; s < first + steps; ++s) {
    opt.zero_grad();
    Tensor loss = loss_of(m, slice(batch_for(m, s)));
    loss.backward();
    opt.step();
    if (sched) sched->step();
    if (losses) losses->push_back(global_mean(loss.item()));
  }
}

auto mesh_of(int shards) {
  int n = dist::world_size();
  return std::make_shared<dist::DeviceMesh>(DeviceType::cpu, std::vector<int>{n / shards, shards},
                                            std::vector<std::string>{"replicate", "shard"});
}

// A load that had to fail: every rank failed, each naming `needle` or saying another rank failed,
// and at least one naming it.
void check_failed_on_every_rank(const std::string& message, const std::string& needle, const std::string& what) {
  INFO(what << ": rank " << dist::rank() << " says: " << message);
  CHECK(!message.empty());
  const bool names_it = message.find(needle) != std::string::npos;
  CHECK((names_it || message.find("failed on another rank") != std::string::npos));
  Tensor named = from_vector({names_it ? 1.0 : 0.0}, {1}, {.dtype = kFloat64});
  dist::world()->all_reduce(named, dist::ReduceOp::max)->wait();
  CHECK(named.item() == 1.0);
}

std::vector<int> shard_counts() {
  std::vector<int> out;
  for (int n : {1, 2, 4})
    if (dist::world_size() % n == 0) out.push_back(n);
  return out;
}

}  // namespace

TEST_CASE("sharded state dict: local shards with placements, no communication, loads back in place") {
  auto [m, root] = make_sharded<UnevenMLP>(1);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  train(*m, opt, 0, 2);
  const auto before = root.comm_stats();
  auto sd = fsdp::sharded_state_dict(*m, &root);
  auto osd = fsdp::sharded_optimizer_state_dict(opt, *m, &root);
  CHECK(root.comm_stats().all_gathers == before.all_gathers);
  CHECK(root.comm_stats().all_reduces == before.all_reduces);
  // fc2.weight [3, 15]: rank r of N holds rows [r*c, r*c + len) with c = ceil(3 / N).
  const int n = dist::world_size(), r = dist::rank();
  const int64_t c = (3 + n - 1) / n, len = std::clamp<int64_t>(3 - r * c, 0, c);
  for (auto& [k, t] : sd)
    if (k == "fc2.weight") {
      CHECK(t.placement == fsdp::Placement{{3, 15}, 0, std::min<int64_t>(3, r * c), len});
      CHECK(t.local.shape() == Shape{len, 15});
    }
  std::map<std::string, fsdp::ShardedTensor> by_key(osd.begin(), osd.end());
  REQUIRE(by_key.count("state.fc1.weight.exp_avg"));
  CHECK(by_key.at("state.fc1.weight.exp_avg").placement == by_key.at("state.fc1.weight.exp_avg_sq").placement);
  CHECK(by_key.at("state.fc1.weight.step").placement.whole());

  // Keep copies, change everything, load the copies back: bitwise the saved values.
  fsdp::ShardedStateDict saved, osaved;
  for (auto& [k, t] : sd) saved.emplace_back(k, fsdp::ShardedTensor{t.local.clone(), t.placement});
  for (auto& [k, t] : osd) osaved.emplace_back(k, fsdp::ShardedTensor{t.local.clone(), t.placement});
  train(*m, opt, 2, 1);
  const auto trained = root.comm_stats();
  fsdp::load_sharded_state_dict(*m, saved, &root);
  fsdp::load_sharded_optimizer_state_dict(opt, *m, osaved, &root);
  CHECK(root.comm_stats().all_gathers == trained.all_gathers);  // loading communicates neither
  CHECK(root.comm_stats().all_reduces == trained.all_reduces);
  auto as_list = [](const fsdp::ShardedStateDict& d) {
    nn::NamedTensorList l;
    for (auto& [k, t] : d) l.emplace_back(k, t.local);
    return l;
  };
  check_same(as_list(fsdp::sharded_state_dict(*m, &root)), as_list(saved), "model after load");
  check_same(as_list(fsdp::sharded_optimizer_state_dict(opt, *m, &root)), as_list(osaved), "optimizer after load");

  // Another layout is refused with the key and both placements.
  if (n > 1) {
    auto wrong = saved;
    for (auto& [k, t] : wrong)
      if (!t.placement.whole()) t.placement.offset += 1;
    CHECK_THROWS_WITH(fsdp::load_sharded_state_dict(*m, wrong, &root),
                      Contains("fc1.weight") && Contains("load a checkpoint to reshard"));
  }
}

TEST_CASE("full state dicts: gathered like the single-process model, to every rank or rank 0, and back") {
  // Reference: the same training in one process on the global batch.
  manual_seed(3);
  auto ref = std::make_shared<TinyGPT>();
  nn::AdamW ref_opt(ref->parameters(), {.lr = 1e-2});
  for (int s = 0; s < 3; ++s) {
    ref_opt.zero_grad();
    loss_of(*ref, gpt_batch(s, 4)).backward();
    ref_opt.step();
  }
  auto [m, root] = make_sharded<TinyGPT>(3);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  train(*m, opt, 0, 3);

  auto full = fsdp::full_state_dict(*m, &root);
  auto want = ref->state_dict();
  REQUIRE(full.size() == want.size());
  for (size_t i = 0; i < full.size(); ++i) {
    REQUIRE(full[i].first == want[i].first);
    check_close(to_vector(full[i].second), to_vector(want[i].second), 1e-4, full[i].first, 1e-5);
  }
  auto ofull = fsdp::full_optimizer_state_dict(opt, *m, &root);
  auto oref = fsdp::name_optimizer_state(ref_opt.state_dict(), fsdp::optimizer_param_names(ref_opt, *ref));
  REQUIRE(ofull.size() == oref.size());
  for (size_t i = 0; i < ofull.size(); ++i) {
    REQUIRE(ofull[i].first == oref[i].first);  // e.g. "state.blocks.0.attn.c_attn.weight.exp_avg"
    check_close(to_vector(ofull[i].second), to_vector(oref[i].second), 1e-3, ofull[i].first, 1e-5);
  }

  auto r0 = fsdp::full_state_dict(*m, &root, {.rank0_only = true, .cpu_offload = true});
  CHECK(r0.size() == (dist::rank() == 0 ? full.size() : 0));
  auto or0 = fsdp::full_optimizer_state_dict(opt, *m, &root, {.rank0_only = true});
  CHECK(or0.size() == (dist::rank() == 0 ? ofull.size() : 0));

  // A full state dict loads into a differently initialised sharded model and optimizer: each
  // rank takes its slice, and gathering again gives the same values bit for bit.
  auto [m2, root2] = make_sharded<TinyGPT>(99);
  nn::AdamW opt2(m2->parameters(), {.lr = 1e-2});
  fsdp::load_full_state_dict(*m2, full, &root2);
  fsdp::load_full_optimizer_state_dict(opt2, *m2, ofull, &root2);
  check_same(fsdp::full_state_dict(*m2, &root2), full, "model loaded from a full state dict");
  check_same(fsdp::full_optimizer_state_dict(opt2, *m2, &root2), ofull, "optimizer loaded from a full state dict");
  // Its state is its own: a step of the first optimizer leaves it as loaded (the step counts, the live tensors of
  // `opt` in `ofull`, had been shared, so each optimizer counted the other's steps).
  const auto loaded = clone_all(fsdp::full_optimizer_state_dict(opt2, *m2, &root2));
  train(*m, opt, 3, 1);
  check_same(fsdp::full_optimizer_state_dict(opt2, *m2, &root2), loaded, "optimizer state after the other's step");
  // ... and the unsharded model from the sharded one's full state dict (the other direction).
  manual_seed(98);
  TinyGPT plain;
  fsdp::load_full_state_dict(plain, full, nullptr);
  check_same(plain.state_dict(), full, "unsharded model loaded from an FSDP full state dict");

  // Bad full state dicts: a wrong shape, a missing key, an unknown key; nothing is written.
  auto wrong = clone_all(full);
  wrong[0].second = zeros({5, 12});
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, wrong, &root2), Contains("wte.weight") && Contains("[5, 12]"));
  auto integers = clone_all(full);  // a float weight stored as integers (an edited header) converts to nothing
  integers[0].second = zeros(full[0].second.shape(), {.dtype = kInt32});
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, integers, &root2),
                    Contains("\"wte.weight\" is") && Contains("i32") && Contains("integers and floating point"));
  auto missing = nn::NamedTensorList(full.begin() + 1, full.end());
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, missing, &root2), Contains("lacks \"wte.weight\""));
  auto extra = full;
  extra.emplace_back("lm_head.weight", full[0].second.clone());
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, extra, &root2), Contains("unexpected key \"lm_head.weight\""));
  auto nan = clone_all(full);  // had loaded; of two entries of one name, the first had counted
  nan[0].second = weft::full(full[0].second.shape(), NAN);
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, nan, &root2), Contains("\"wte.weight\" holds nan at element 0"));
  auto twice = full;
  twice.push_back(full[0]);
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, twice, &root2), Contains("\"wte.weight\" is given twice"));
  if (dist::world_size() > 1) {  // ranks passing different dicts (each takes its own slices) had loaded a mix
    auto mine = clone_all(full);
    if (dist::rank() == 1) mine[0].second = mine[0].second * 2.0;
    CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, mine, &root2),
                      Contains("fsdp: load_full_state_dict: the ranks differ: the full dict's digest is"));
  }
  check_same(fsdp::full_state_dict(*m2, &root2), full, "model after refused loads");
  // A dict only rank 0 holds (rank0_only) loads by broadcast; rank 0's bad dict fails every rank, nothing written.
  auto [m3, root3] = make_sharded<TinyGPT>(97);
  const auto before = fsdp::full_state_dict(*m3, &root3);
  CHECK_THROWS_WITH(fsdp::broadcast_full_state_dict(*m3, dist::rank() == 0 ? missing : nn::NamedTensorList{}, &root3),
                    Contains("lacks \"wte.weight\""));
  if (dist::world_size() > 1)
    CHECK_THROWS_WITH(fsdp::broadcast_full_state_dict(*m3, full, &root3), Contains("only global rank 0 passes"));
  check_same(fsdp::full_state_dict(*m3, &root3), before, "model after refused broadcasts");
  fsdp::broadcast_full_state_dict(*m3, r0, &root3);
  check_same(fsdp::full_state_dict(*m3, &root3), full, "model loaded from rank 0's full state dict");
  // A separately saved copy of a tied weight (nanoGPT's lm_head.weight) is accepted when equal.
  fsdp::load_full_state_dict(*m2, extra, &root2, {{"lm_head.weight", "wte.weight"}});
  extra.back().second = extra.back().second + 1.0;
  CHECK_THROWS_WITH(fsdp::load_full_state_dict(*m2, extra, &root2, {{"lm_head.weight", "wte.weight"}}),
                    Contains("\"lm_head.weight\" must equal \"wte.weight\""));
}

// A group left gathered (unshard(), a loss with gradients on and no backward, reshard_after_backward false) held
// the whole parameters in its slots: a checkpoint saved then held them as shards (it failed at load), and state
// dicts and loads failed with shape errors. State-dict work reshards first, as FSDP2 does.
TEST_CASE("state dicts and checkpoints of a model left gathered are those of its shards") {
  const fs::path dir = shared_dir("gathered");
  int64_t step = 0;  // each case's checkpoint the newest
  for (const std::string how : {"unshard", "forward", "reshard_after_backward false"}) {
    INFO(how);
    auto [m, root] = make_sharded<TinyGPT>(7);
    nn::AdamW opt(m->parameters(), {.lr = 1e-2});
    train(*m, opt, 0, 2);
    const auto full = fsdp::full_state_dict(*m, &root), ofull = fsdp::full_optimizer_state_dict(opt, *m, &root);
    const auto gather = [&, &m = m, &root = root] {
      if (how == "unshard") root.unshard();
      if (how == "forward") (void)loss_of(*m, slice(gpt_batch(5, 4)));
      if (how == "reshard_after_backward false") root.set_reshard_after_backward(false), loss_of(*m, slice(gpt_batch(5, 4))).backward();
    };
    gather();
    check_same(fsdp::full_state_dict(*m, &root), full, how + ": full state dict");
    if (how != "reshard_after_backward false") check_same(fsdp::full_optimizer_state_dict(opt, *m, &root), ofull, how);
    opt.zero_grad();
    gather();
    fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = ++step});
    gather();
    fsdp::load_checkpoint(dir.string(), *m, &opt, &root);
    check_same(fsdp::full_state_dict(*m, &root), full, how + ": saved and loaded");
    gather();
    fsdp::load_full_state_dict(*m, full, &root);
    check_same(fsdp::full_state_dict(*m, &root), full, how + ": a full state dict loaded");
  }
}

TEST_CASE("checkpoints reshard N -> M for every pair of shard counts (HSDP meshes of N shards)") {
  fs::path dir = shared_dir("reshard");
  std::map<int, std::pair<nn::NamedTensorList, nn::NamedTensorList>> saved;  // N -> full model, optimizer
  for (int n : shard_counts()) {
    auto [m, root] = make_sharded<TinyGPT>(5, mesh_of(n));
    nn::AdamW opt(m->parameters(), {.lr = 1e-2});
    train(*m, opt, 0, 2);
    saved[n] = {fsdp::full_state_dict(*m, &root), fsdp::full_optimizer_state_dict(opt, *m, &root)};
    std::string where = fsdp::save_checkpoint((dir / std::to_string(n)).string(), *m, &opt, &root, {.step = 2});
    CHECK(fs::path(where).filename() == "step_00000002");
  }
  barrier();
  for (int n : shard_counts())
    for (int m_shards : shard_counts()) {
      INFO("saved with " << n << " shards, loaded with " << m_shards);
      auto [m, root] = make_sharded<TinyGPT>(77, mesh_of(m_shards));
      nn::AdamW opt(m->parameters(), {.lr = 1e-2});
      auto ts = fsdp::load_checkpoint((dir / std::to_string(n)).string(), *m, &opt, &root);
      CHECK(ts.step == 2);
      check_same(fsdp::full_state_dict(*m, &root), saved[n].first, "model");
      check_same(fsdp::full_optimizer_state_dict(opt, *m, &root), saved[n].second, "optimizer");
    }
  // The index records the layout; verify passes.
  if (dist::rank() == 0)
    for (int n : shard_counts()) {
      auto ix = fsdp::read_checkpoint_index((dir / std::to_string(n)).string());
      CHECK(ix.num_shards == n);
      CHECK(ix.world_size == dist::world_size());
      CHECK(ix.files.size() == size_t(n));
      CHECK(ix.rng.size() == size_t(dist::world_size()));
      auto report = fsdp::verify_checkpoint((dir / std::to_string(n)).string());
      CHECK(report.files == size_t(n));
    }
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("consolidate writes the full state dict to one file, aliases included") {
  fs::path dir = shared_dir("consolidate");
  auto [m, root] = make_sharded<TinyGPT>(6);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  train(*m, opt, 0, 2);
  auto full = fsdp::full_state_dict(*m, &root);
  auto ofull = fsdp::full_optimizer_state_dict(opt, *m, &root);
  fsdp::save_checkpoint(dir.string(), *m, &opt, &root,
                        {.step = 2, .app = {{"format", "test"}}, .aliases = {{"lm_head.weight", "wte.weight"}}});
  if (dist::rank() == 0) {
    fsdp::consolidate_checkpoint(dir.string(), (dir / "model.safetensors").string());
    auto file = load_safetensors((dir / "model.safetensors").string());
    nn::NamedTensorList want = full;
    want.emplace_back("lm_head.weight", full[0].second);
    check_same(file.tensors, want, "consolidated file");
    CHECK(file.metadata.at("format") == "test");
    CHECK(file.metadata.at("step") == "2");
    fsdp::consolidate_checkpoint(dir.string(), (dir / "all.safetensors").string(), true);
    auto all = load_safetensors((dir / "all.safetensors").string());
    nn::NamedTensorList optim;
    for (auto& [k, t] : all.tensors)
      if (k.rfind("optim.", 0) == 0) optim.emplace_back(k.substr(6), t);
    check_same(optim, ofull, "consolidated optimizer state");
  }
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

// Dropout draws from the default generator, so exact resume needs the RNG state too.
struct DropoutMLP : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
  DropoutMLP() : nn::Module("UnevenMLP") {  // UnevenMLP's shapes and batches
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(7, 15));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.3));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(15, 3));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*drop)(relu((*fc1)(x)))); }
  using nn::Module::forward;
};

TEST_CASE("exact resume: 10 steps equal 5 steps, save, fresh model and optimizer, load, 5 steps (bitwise)") {
  fs::path dir = shared_dir("resume");
  auto run = [&](int first, int steps, bool load, bool save, std::vector<double>& losses) {
    auto [m, root] = make_sharded<DropoutMLP>(load ? 1234 : 11);
    nn::AdamW opt(m->parameters(), {.lr = 1e-2});
    nn::WarmupCosineLR sched(opt, 2, 10);
    manual_seed(load ? 4321 : 12);  // the dropout stream: restored from the checkpoint when loading
    if (load) {
      auto ts = fsdp::load_checkpoint(dir.string(), *m, &opt, &root);
      REQUIRE(ts.step == first);
      CHECK(ts.data.at("batch") == first);
      sched.set_last_step(ts.step);
    }
    train(*m, opt, first, steps, &losses, &sched);
    if (save) fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = first + steps, .data = {{"batch", 5}}});
  };
  std::vector<double> whole, part;
  run(0, 10, false, false, whole);
  run(0, 5, false, true, part);
  run(5, 5, true, false, part);
  REQUIRE(part.size() == 10);
  for (int i = 0; i < 10; ++i) {
    INFO("step " << i + 1 << ": uninterrupted " << whole[size_t(i)] << ", resumed " << part[size_t(i)]);
    CHECK(whole[size_t(i)] == part[size_t(i)]);
  }
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("retention and latest: keep_last, incomplete checkpoints ignored, same step replaced") {
  fs::path dir = shared_dir("keep");
  auto [m, root] = make_sharded<UnevenMLP>(2);
  for (int step = 1; step <= 4; ++step) fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = step},
                                                              {.keep_last = 2});
  fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 4}, {.keep_last = 2});  // again: replaced
  barrier();
  CHECK(!fs::exists(dir / "step_00000001"));
  CHECK(!fs::exists(dir / "step_00000002"));
  CHECK(fs::exists(dir / "step_00000003" / "index.json"));
  CHECK(fs::path(fsdp::latest_checkpoint(dir.string())).filename() == "step_00000004");
  barrier();
  if (dist::rank() == 0) fs::create_directories(dir / "step_00000009");  // no index.json: not complete
  if (dist::rank() == 0) fs::create_directories(dir / ".tmp-step_00000010");
  barrier();
  CHECK(fs::path(fsdp::latest_checkpoint(dir.string())).filename() == "step_00000004");
  CHECK(fsdp::latest_checkpoint((dir / "none").string()).empty());
  barrier();
  // A step_N directory that is not a checkpoint (no index.json) is never replaced by a save.
  if (dist::rank() == 0) std::ofstream(dir / "step_00000009" / "mine.txt") << "precious";
  barrier();
  CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 9}, {.keep_last = 2}),
                    Catch::Contains("step_00000009 exists and is not a checkpoint (it has no index.json)"));
  barrier();
  CHECK(fs::exists(dir / "step_00000009" / "mine.txt"));
  std::vector<std::string> unreadable;  // and latest_checkpoint names it
  CHECK(fs::path(fsdp::latest_checkpoint(dir.string(), &unreadable)).filename() == "step_00000004");
  CHECK_THAT(fmt::format("{}", fmt::join(unreadable, " | ")), Catch::Contains("step_00000009 has no index.json"));
  // Leftovers of saves that stopped midway (a crash, kill -9) are removed when a later step is
  // published; those of later steps are kept.
  if (dist::rank() == 0) {
    fs::create_directories(dir / ".tmp-step_00000002" / "sub");
    std::ofstream(dir / ".tmp-step_00000002" / "model-00000.safetensors") << "partial";
    fs::create_directories(dir / ".old-step_00000003");
  }
  barrier();
  fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 5}, {.keep_last = 2});
  barrier();
  CHECK(!fs::exists(dir / ".tmp-step_00000002"));
  CHECK(!fs::exists(dir / ".old-step_00000003"));
  CHECK(fs::exists(dir / ".tmp-step_00000010"));
  CHECK(fs::exists(dir / "step_00000005" / "index.json"));
  CHECK(!fs::exists(dir / ".tmp-step_00000005"));
  barrier();
  // A step that is a link to a checkpoint kept elsewhere rotates away as a link: rotation had removed the index.json
  // of the checkpoint it pointed to (through the link), leaving that one incomplete.
  const fs::path archive = shared_dir("keep_archive");
  fsdp::save_checkpoint(archive.string(), *m, nullptr, &root, {.step = 6});
  barrier();
  if (dist::rank() == 0) fs::create_directory_symlink(archive / "step_00000006", dir / "step_00000006");
  barrier();
  for (int step = 7; step <= 8; ++step) fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = step}, {.keep_last = 1});
  barrier();
  CHECK(!fs::exists(dir / "step_00000006"));
  CHECK(!fs::is_symlink(dir / ".gone-step_00000006"));
  CHECK(fs::exists(archive / "step_00000006" / "index.json"));
  CHECK_NOTHROW(fsdp::verify_checkpoint((archive / "step_00000006").string()));
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir), fs::remove_all(archive);
}

TEST_CASE("bad checkpoints fail on every rank with the file and key, and change nothing") {
  fs::path dir = shared_dir("corrupt");
  auto [m, root] = make_sharded<TinyGPT>(8);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  train(*m, opt, 0, 1);
  const std::string good = fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = 1});
  const auto before = clone_all(fsdp::full_state_dict(*m, &root));
  if (dist::world_size() > 1) {  // ranks saving to different directories, steps or positions stop together
    const std::string mine = (dir / fmt::format("rank{}", dist::rank())).string();
    CHECK_THROWS_WITH(fsdp::save_checkpoint(mine, *m, &opt, &root, {.step = 1}),  // had published a partial one
                      Contains("save_checkpoint: the ranks differ: the checkpoint directory is"));
    CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = 2 + dist::rank()}),
                      Contains("the step is 2 on rank 0"));
    CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = 2, .data = {{"batch", dist::rank()}}}),
                      Contains("the data position's batch is 0 on rank 0"));  // only rank 0's had been recorded
    fsdp::CheckpointProgress far{.step = 2, .app = {{"arch", "gpt2"}, {"a_long_field", std::string(200, 'x')},
                                                  {"source", fmt::format("dir{}", dist::rank())}}};
    CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, &opt, &root, far),  // named past a long value
                      Contains("the description's source is dir0 on rank 0"));
    // Refused after the ranks wrote their files (rank 0's optimizer has no state): nothing is left behind.
    nn::AdamW fresh(m->parameters(), {.lr = 0.0});  // its step leaves the weights as they are
    if (dist::rank() != 0) fresh.step();
    CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, &fresh, &root, {.step = 3}),
                      Contains("holds other tensors than rank 0"));
    barrier();
    CHECK(!fs::exists(dir / "step_00000003"));
    CHECK(!fs::exists(dir / ".tmp-step_00000003"));
  }
  const std::string last = fmt::format("rank_{:05d}.safetensors", dist::world_size() - 1);

  // Each case: a copy of the good checkpoint, damaged by rank 0; every rank must fail, each
  // naming the problem or saying another rank failed, and at least one naming it.
  auto expect_failure = [&](const std::string& name, const std::function<void(const fs::path&)>& damage,
                            const std::string& needle, nn::Module& model, const fsdp::FSDPModule& r,
                            nn::Optimizer* o) {
    fs::path bad = dir / name;
    if (dist::rank() == 0) {
      fs::copy(good, bad);
      damage(bad);
    }
    barrier();
    std::string message;
    try {
      fsdp::load_checkpoint(bad.string(), model, o, &r);
    } catch (const Error& e) {
      message = e.what();
    }
    check_failed_on_every_rank(message, needle, name);
    return message;
  };
  auto flip_byte = [&](const fs::path& d) {
    std::fstream f(d / last, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(char(c ^ 0x40));
  };
  expect_failure("flipped", flip_byte, last + " is", *m, root, &opt);  // "sha256 of .../rank_N is ..."
  expect_failure("truncated", [&](const fs::path& d) { fs::resize_file(d / last, fs::file_size(d / last) - 7); },
                 last + " is", *m, root, &opt);
  expect_failure("deleted", [&](const fs::path& d) { fs::remove(d / last); }, last + " is missing", *m, root, &opt);
  expect_failure("no_index", [&](const fs::path& d) { fs::remove(d / "index.json"); }, "no complete checkpoint", *m,
                 root, &opt);
  auto drop_rng = [](const fs::path& d) {  // a resumed run would draw other numbers than the one that saved
    fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(d.string());
    ix.rng.clear();
    std::ofstream(d / "index.json") << fsdp::checkpoint_index_json(ix);
  };
  auto int_dtype = [](const fs::path& d) {  // the index says a float weight is integers
    fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(d.string());
    for (auto& e : ix.tensors)
      if (e.key == "model.wte.weight") e.dtype = kInt32;
    std::ofstream(d / "index.json") << fsdp::checkpoint_index_json(ix);
  };
  expect_failure("int_dtype", int_dtype, "\"model.wte.weight\" is I32 [", *m, root, &opt);
  // Pieces that overlap and leave a gap hold as many elements as a tiling: the index is refused, not the gap left unread.
  auto overlap = [](const fs::path& d) {
    fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(d.string());
    for (auto& e : ix.tensors)
      if (e.key == "model.wte.weight") e.shards.size() > 1 ? void(e.shards.back().offset -= 1) : void(e.shards[0].length -= 1);
    std::ofstream(d / "index.json") << fsdp::checkpoint_index_json(ix);
  };
  expect_failure("overlap", overlap, dist::world_size() > 1 ? "\"model.wte.weight\" has pieces that overlap at index"
                 : "\"model.wte.weight\" has pieces that cover", *m, root, &opt);
  expect_failure("no_rng", drop_rng, "\"rng\" holds 0 generator states for world_size", *m, root, &opt);
  // A hand-edited index that a resume would refuse is refused where it is read, so verify_checkpoint refuses it too.
  auto edit_index = [](const std::function<void(fsdp::CheckpointIndex&)>& edit) {
    return [edit](const fs::path& d) {
      fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(d.string());
      edit(ix);
      std::ofstream(d / "index.json") << fsdp::checkpoint_index_json(ix);
    };
  };
  const std::string rngs = fmt::format("\"rng\" holds {} generator states for world_size {} (one a rank)",
                                       dist::world_size() + 1, dist::world_size());
  expect_failure("extra_rng", edit_index([](fsdp::CheckpointIndex& ix) { ix.rng.push_back(ix.rng.back()); }), rngs, *m,
                 root, &opt);
  CHECK_THROWS_WITH(fsdp::verify_checkpoint((dir / "extra_rng").string()), Contains(rngs));
  // Aliases verify accepted and consolidate then refused (a missing target, a name the checkpoint holds itself), and a
  // NUL in the description that cut the messages quoting it short: refused where the index is read.
  const std::string held = fsdp::read_checkpoint_index(good).tensors[0].key.substr(6);  // without "model."
  for (const auto& names : {std::pair{std::string("lm_head.weight"), std::string("nope.weight")}, {held, held}}) {
    const std::string alias = names.first, target = names.second;  // (clang 14 captures no structured binding)
    const std::string why = fmt::format("\"aliases\" \"{}\" names \"{}\": an alias names a tensor the checkpoint holds, "
                                        "and is not one itself", alias, target);
    expect_failure("alias_" + target, edit_index([&](fsdp::CheckpointIndex& ix) { ix.training.aliases[alias] = target; }),
                   why, *m, root, &opt);
    CHECK_THROWS_WITH(fsdp::verify_checkpoint((dir / ("alias_" + target)).string()), Contains(why));
  }
  // Two pieces of equal length whose offsets are swapped tile the tensor too: verify passed it and a load or
  // consolidate permuted the rows. Pieces must lie in their files' shard order.
  const fsdp::CheckpointIndex read_good = fsdp::read_checkpoint_index(good);
  for (const auto& e : read_good.tensors)
    if (e.shards.size() >= 2 && e.shards[0].length == e.shards[1].length && e.shards[0].length > 0) {
      const std::string why = fmt::format("\"{}\" has its piece at index {} of dim {} in {}, a file before the "
                                          "previous piece's", e.key, e.shards[1].offset, e.shard_dim, e.shards[0].file);
      expect_failure("swapped", edit_index([key = e.key](fsdp::CheckpointIndex& ix) {
                       for (auto& t : ix.tensors)
                         if (t.key == key) std::swap(t.shards[0].offset, t.shards[1].offset);
                     }), why, *m, root, &opt);
      CHECK_THROWS_WITH(fsdp::verify_checkpoint((dir / "swapped").string()), Contains(why));
      break;
    }
  expect_failure("nul", edit_index([](fsdp::CheckpointIndex& ix) { ix.training.app["model"] = std::string("mlp\0x", 5); }),
                 "\"app\" \"model\" holds a NUL character", *m, root, &opt);
  const std::string negative = "\"data\" batch is -3, not a count";
  expect_failure("negative_data", edit_index([](fsdp::CheckpointIndex& ix) { ix.training.data["batch"] = -3; }),
                 negative, *m, root, &opt);
  CHECK_THROWS_WITH(fsdp::verify_checkpoint((dir / "negative_data").string()), Contains(negative));
  CHECK_THROWS_WITH(fsdp::save_checkpoint((dir / "negative_save").string(), *m, &opt, &root, {.data = {{"batch", -1}}}),
                    Contains("save_checkpoint: data position batch is -1, not a count"));
  CHECK(!fs::exists(dir / "negative_save"));
  // index.json is JSON text: a description that is not UTF-8 (a path with another byte) had failed in the JSON writer
  // after every shard was written, with its bare message.
  const fsdp::CheckpointProgress not_utf8{.app = {{"source", "/data/n\xffme"}}};
  CHECK_THROWS_WITH(fsdp::save_checkpoint((dir / "not_utf8").string(), *m, &opt, &root, not_utf8),
                    Contains("checkpoint: the description's source is not UTF-8 text (\"/data/n\\ufffdme\")"));
  CHECK_THROWS_WITH(fsdp::check_recordable({.run = "r\xc3"}), Contains("the run is not UTF-8 text"));
  CHECK(!fs::exists(dir / "not_utf8"));
  // Ranks whose path holds different checkpoints (node-local disks) load none of them.
  const std::string later = fsdp::save_checkpoint((dir / "later").string(), *m, &opt, &root, {.step = 2});
  if (dist::world_size() > 1) {
    std::string message;
    try {
      fsdp::load_checkpoint(dist::rank() == 0 ? good : later, *m, &opt, &root);
    } catch (const Error& e) {
      message = e.what();
    }
    check_failed_on_every_rank(message, "the checkpoint read is step 1, index.json sha256", "other checkpoints");
    CHECK_THAT(message, Contains("step 2, index.json sha256") && Contains("every rank must read the same checkpoint"));
  }
  // Without hash checks a truncated tensor is still caught, naming the file and the tensor.
  {
    fs::path bad = dir / "truncated_noverify";
    if (dist::rank() == 0) {
      fs::copy(good, bad);
      fs::resize_file(bad / last, fs::file_size(bad / last) - 7);
    }
    barrier();
    std::string message;
    try {
      fsdp::load_checkpoint(bad.string(), *m, &opt, &root, {.verify = false});
    } catch (const Error& e) {
      message = e.what();
    }
    INFO("rank " << dist::rank() << ": " << message);
    CHECK(!message.empty());
  }
  // Another model: other shapes (fc1 7 -> 16 instead of 15), then other names.
  struct WiderMLP : nn::Module {
    WiderMLP() : nn::Module("WiderMLP") {
      register_module("fc1", std::make_shared<nn::Linear>(7, 16));
      register_module("fc2", std::make_shared<nn::Linear>(16, 3));
    }
  };
  fs::path mlp_dir = dir / "mlp";
  {
    auto [mlp, mroot] = make_sharded<UnevenMLP>(1);
    fsdp::save_checkpoint(mlp_dir.string(), *mlp, nullptr, &mroot, {.step = 0});
  }
  barrier();
  {
    manual_seed(1);
    auto wide = std::make_shared<WiderMLP>();
    for (auto& [n, c] : wide->named_children()) fsdp::fully_shard(c);
    auto wroot = fsdp::fully_shard(wide);
    CHECK_THROWS_WITH(fsdp::load_checkpoint(mlp_dir.string(), *wide, nullptr, &wroot),
                      Contains("\"model.fc1.weight\"") && Contains("[15, 7]") && Contains("[16, 7]"));
  }
  CHECK_THROWS_WITH(fsdp::load_checkpoint(mlp_dir.string(), *m, &opt, &root),
                    Contains("index.json") && Contains("no tensor \"model.wte.weight\"") &&
                        Contains("another model"));
  // Nothing was written by any failed load.
  check_same(fsdp::full_state_dict(*m, &root), before, "model after failed loads");

  // A save that cannot create its directory fails on every rank and leaves the old one valid.
  if (dist::rank() == 0) std::ofstream(dir / "a_file") << "x";
  barrier();
  CHECK_THROWS(fsdp::save_checkpoint((dir / "a_file" / "sub").string(), *m, &opt, &root, {.step = 2}));
  if (dist::rank() == 0) CHECK(fsdp::verify_checkpoint(good).files == size_t(dist::world_size()));
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("index.json: numbers out of their type's range are errors, not undefined behaviour") {
  // Found by tests/fuzz/fuzz_checkpoint_index.cpp under UBSan: floats cast to integers, and a
  // piece's offset + length past 2^63. Each rank reads its own copy; no communication.
  fs::path dir = fs::temp_directory_path() / fmt::format("weft_test_index_{}", ::getpid());
  fs::create_directories(dir);
  const std::string head = R"j({"format":"weft-checkpoint","format_version":2,"weft_version":"0","step":0,)j"
                           R"j("world_size":1,"num_shards":1,"app":{},"aliases":{},"files":[{"file":"f","shard":0,)j"
                           R"j("bytes":1,"sha256":""}],)j";
  auto read = [&](const std::string& rest) {
    std::ofstream(dir / "index.json") << head << rest;
    return fsdp::read_checkpoint_index(dir.string());
  };
  const std::string ok_mesh = R"j("mesh":{"shape":[1],"dim_names":["x"]},)j", ok_rest = R"j("data":{},"rng":[{"seed":0,"offset":0}],)j";
  const std::string tensor = R"j("tensors":{"k":{"dtype":"F32","shape":[4],"placement":"Shard(0)","shards":)j";
  CHECK(read(ok_mesh + ok_rest + tensor + R"j([{"file":"f","offset":0,"length":4}]}}})j").tensors.size() == 1);
  CHECK_THROWS_WITH(read(R"j("mesh":{"shape":[1e300],"dim_names":["x"]},)j" + ok_rest + R"j("tensors":{}})j"),
                    Contains("\"mesh.shape\" holds 1e+300, not an integer"));
  CHECK_THROWS_WITH(read(ok_mesh + R"j("data":{"epoch":-1e300},"rng":[],"tensors":{}})j"), Contains("\"data\" holds"));
  CHECK_THROWS_WITH(read(ok_mesh + R"j("data":{},"rng":[{"seed":0,"offset":4.5e40}],"tensors":{}})j"),
                    Contains("\"rng.offset\" holds"));
  CHECK_THROWS_WITH(read(ok_mesh + R"j("data":{},"rng":[{"seed":0,"offset":-5}],"tensors":{}})j"),
                    Contains("\"rng.offset\" is -5, not an integer from 0"));
  CHECK_THROWS_WITH(read(ok_mesh + ok_rest + tensor +
                         R"j([{"file":"f","offset":3,"length":9223372036854775807}]}}})j"),
                    Contains("outside its extent 4"));
  // Integers past their field's type (an int narrowed, an unsigned past 2^63 wrapped), files and RNG states that
  // are not one a shard / rank in order.
  auto with = [&](std::string text, const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
    std::ofstream(dir / "index.json") << text << ok_mesh << ok_rest << R"j("tensors":{}})j";
    return fsdp::read_checkpoint_index(dir.string());
  };
  CHECK_THROWS_WITH(with(head, "\"world_size\":1", "\"world_size\":4294967297"),
                    Contains("\"world_size\" is 4294967297, not an integer from 1 to 2147483647"));
  CHECK_THROWS_WITH(with(head, "\"format_version\":2", "\"format_version\":4294967298"),
                    Contains("\"format_version\" is 4294967298, not an integer from 0"));
  CHECK_THROWS_WITH(with(head, "\"step\":0", "\"step\":18446744073709551615"),
                    Contains("\"step\" is 18446744073709551615, not an integer from 0 to 9223372036854775807"));
  CHECK_THROWS_WITH(with(head, "\"bytes\":1", "\"bytes\":100000000000000000000"), Contains("\"files.bytes\" is"));
  CHECK_THROWS_WITH(with(head, "}],", R"j(},{"file":"g","shard":0,"bytes":1,"sha256":""}],)j"),
                    Contains("\"files\" lists shard 0 at position 1"));
  CHECK_THROWS_WITH(with(head, "\"world_size\":1,\"num_shards\":1", "\"world_size\":2,\"num_shards\":2"),
                    Contains("lists 1 files for 2 shards"));
  std::ofstream(dir / "index.json") << head << ok_mesh << R"j("data":{},"rng":[{"rank":5,"seed":0,"offset":0}],)j"
                                    << R"j("tensors":{}})j";
  CHECK_THROWS_WITH(fsdp::read_checkpoint_index(dir.string()), Contains("holds the state of rank 5 at position 0"));
  fs::remove_all(dir);
}

namespace {

// Rewrites `file` of the checkpoint at `dir` with `edit` applied to its tensors and records the new
// size and sha256 in the index, so that only what `edit` did is wrong with it.
void edit_shard(const fs::path& dir, const std::string& file, const std::function<void(NamedTensors&)>& edit) {
  auto contents = load_safetensors((dir / file).string());
  edit(contents.tensors);
  save_safetensors((dir / file).string(), contents.tensors, contents.metadata);
  fsdp::CheckpointIndex ix = fsdp::read_checkpoint_index(dir.string());
  for (auto& f : ix.files) {
    f.bytes = fs::file_size(ix.file_path(f.name));
    f.sha256 = sha256_file(ix.file_path(f.name));
  }
  std::ofstream(dir / "index.json") << fsdp::checkpoint_index_json(ix);
}

// Sets element 0 of tensor `key` in `tensors` to `value`.
void set_first(NamedTensors& tensors, const std::string& key, double value) {
  for (auto& [k, t] : tensors)
    if (k == key) {
      Tensor flat = t.view({-1});
      flat.narrow(0, 0, 1).fill_(value);
      return;
    }
  FAIL("no tensor " << key << " in the shard file");
}

}  // namespace

TEST_CASE("non-finite or impossible state is refused by load, verify and consolidate, naming the tensor") {
  fs::path dir = shared_dir("nonfinite");
  auto [m, root] = make_sharded<TinyGPT>(8);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  train(*m, opt, 0, 1);
  const std::string good = fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = 1});
  const auto before = clone_all(fsdp::full_state_dict(*m, &root));
  const std::string file0 = "rank_00000.safetensors";
  struct Case {
    std::string name;
    std::function<void(NamedTensors&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"nan_weight", [](NamedTensors& t) { set_first(t, "model.wte.weight", NAN); }, "\"model.wte.weight\" holds nan at element 0"},
      {"inf_moment", [](NamedTensors& t) { set_first(t, "optim.state.wte.weight.exp_avg", INFINITY); },
       "optim.state.wte.weight.exp_avg\" holds inf at element 0"},
      {"negative_second_moment", [](NamedTensors& t) { set_first(t, "optim.state.wte.weight.exp_avg_sq", -1.0); },
       "optim.state.wte.weight.exp_avg_sq\" holds -1 at element 0: exp_avg_sq cannot be negative"},
      {"unlisted", [](NamedTensors& t) { t.emplace_back("model.stray", zeros({2})); },
       "holds \"model.stray\", which the index does not list there"},
  };
  for (const Case& c : cases) {
    const fs::path bad = dir / c.name;
    if (dist::rank() == 0) {
      fs::copy(good, bad);
      edit_shard(bad, file0, c.edit);
    }
    barrier();
    std::string message;
    try {
      fsdp::load_checkpoint(bad.string(), *m, &opt, &root);
    } catch (const Error& e) {
      message = e.what();
    }
    check_failed_on_every_rank(message, c.needle, c.name);
    if (dist::rank() == 0 && c.name != "negative_second_moment") {  // verify and consolidate need no optimizer
      CHECK_THROWS_WITH(fsdp::verify_checkpoint(bad.string()),
                        Contains(c.name == "unlisted" ? c.needle : c.needle.substr(c.needle.find('"') + 1)));
      CHECK_THROWS_WITH(fsdp::consolidate_checkpoint(bad.string(), (dir / "out.safetensors").string(), true),
                        Contains(c.name == "unlisted" ? c.needle : "nothing was written"));
      CHECK(!fs::exists(dir / "out.safetensors"));
    }
    barrier();
  }
  // Told to, consolidate copies the NaN.
  if (dist::rank() == 0) {
    fsdp::consolidate_checkpoint((dir / "nan_weight").string(), (dir / "out.safetensors").string(), false, true);
    auto out = load_safetensors((dir / "out.safetensors").string()).tensors;
    bool found = false;
    for (auto& [k, t] : out)
      if (k == "wte.weight") found = std::isnan(to_vector(t)[0]);
    CHECK(found);
  }
  // Nothing was written by any failed load; the good checkpoint loads and verifies.
  check_same(fsdp::full_state_dict(*m, &root), before, "model after refused loads");
  CHECK_NOTHROW(fsdp::load_checkpoint(good, *m, &opt, &root));
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("keep_last keeps, besides the newest, the best recorded loss and keep_also; losses round-trip") {
  fs::path dir = shared_dir("best");
  auto [m, root] = make_sharded<UnevenMLP>(2);
  const std::vector<double> losses = {3.0, 1.0, 2.0, NAN, 5.0, 4.0};
  for (int step = 1; step <= 6; ++step) {
    const std::string keep_also = step > 3 ? (dir / "step_00000003").string() : std::string();
    fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = step, .loss = losses[size_t(step - 1)]},
                          {.keep_last = 1, .keep_also = keep_also});
  }
  barrier();
  // Step 6 (newest), step 2 (loss 1, the lowest) and step 1 (its weights gave that loss), step 3 (keep_also since
  // step 4); the NaN of step 4 is never "best".
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("step_", 0) == 0) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"step_00000001", "step_00000002", "step_00000003", "step_00000006"});
  CHECK(fsdp::older_kept_checkpoints(dir.string(), 1) ==
        std::vector<std::string>{(dir / "step_00000001").string(), (dir / "step_00000002").string(),
                                 (dir / "step_00000003").string()});
  CHECK(*fsdp::read_checkpoint_index((dir / "step_00000002").string()).training.loss == 1.0);
  barrier();
  fsdp::save_checkpoint((dir / "nan").string(), *m, nullptr, &root, {.step = 1, .loss = NAN});
  fsdp::save_checkpoint((dir / "none").string(), *m, nullptr, &root, {.step = 1});
  CHECK(std::isnan(*fsdp::read_checkpoint_index((dir / "nan").string()).training.loss));
  // A negative NaN (what --on-nan skip's loss can be) and an infinity read back as written.
  fsdp::save_checkpoint((dir / "neg_nan").string(), *m, nullptr, &root, {.step = 1, .loss = -NAN});
  fsdp::save_checkpoint((dir / "neg_inf").string(), *m, nullptr, &root, {.step = 1, .loss = -INFINITY});
  CHECK(std::isnan(*fsdp::read_checkpoint_index((dir / "neg_nan").string()).training.loss));
  CHECK(*fsdp::read_checkpoint_index((dir / "neg_inf").string()).training.loss == -INFINITY);
  CHECK(!fsdp::read_checkpoint_index((dir / "none").string()).training.loss);
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("keep_last rotates only its own run's checkpoints; replace_other_runs removes the others; runs round-trip") {
  fs::path dir = shared_dir("runs");
  auto [m, root] = make_sharded<UnevenMLP>(2);
  auto steps = [&] {
    std::vector<std::string> left;
    for (auto& [step, ck] : fsdp::checkpoint_runs(dir.string())) left.push_back(fmt::format("{} {}", step, ck.run));
    return left;
  };
  for (int step = 1; step <= 2; ++step) fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = step, .run = "a"});
  fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 5});  // a checkpoint recording no run
  for (int step = 3; step <= 4; ++step)
    fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = step, .run = "b"}, {.keep_last = 1});
  barrier();
  // b's step 3 rotated away; a's steps and the unrecorded step 5 are not b's to remove.
  CHECK(steps() == std::vector<std::string>{"1 a", "2 a", "4 b", "5 "});
  barrier();
  fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 6, .run = "b"}, {.replace_other_runs = true});
  barrier();
  CHECK(steps() == std::vector<std::string>{"4 b", "6 b"});
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a checkpoint directory has one writer: a second claim names the holder; leftovers go at claim") {
  // One process's own directory: flock locks conflict between open files, even in one process.
  const fs::path dir = fs::temp_directory_path() / fmt::format("weft_test_lock_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / ".tmp-step_00000099" / "sub");
  fs::create_directories(dir / ".old-step_00000007");
  fs::create_directories(dir / "step_00000005");
  // A replace of step 9 cut short between its renames: the published one (complete) aside, the new one complete too;
  // a removal of step 11 cut short before its index went (it had been put back as a replace's).
  for (const char* d : {".old-step_00000009", ".tmp-step_00000009", ".gone-step_00000011"}) {
    fs::create_directories(dir / d);
    std::ofstream(dir / d / "index.json") << d;
  }
  {
    fsdp::CheckpointDirLock first(dir.string());
    CHECK(!fs::exists(dir / ".tmp-step_00000099"));
    CHECK(!fs::exists(dir / ".old-step_00000007"));
    CHECK(fs::exists(dir / "step_00000005"));
    CHECK(!fs::exists(dir / ".tmp-step_00000009"));
    CHECK(!fs::exists(dir / ".old-step_00000009"));
    std::ifstream restored(dir / "step_00000009" / "index.json");
    CHECK(std::string(std::istreambuf_iterator<char>(restored), {}) == ".old-step_00000009");
    CHECK((!fs::exists(dir / ".gone-step_00000011") && !fs::exists(dir / "step_00000011")));
    CHECK_THROWS_WITH(fsdp::CheckpointDirLock(dir.string()),
                      Contains("is in use by another run") && Contains(fmt::format("pid {},", ::getpid())));
  }
  CHECK_NOTHROW(fsdp::CheckpointDirLock(dir.string()));  // released with its holder
  fs::remove_all(dir);
}

// A parameter with no rows has no pieces in the index (nothing to write); the reader takes that as the tiling of its
// 0 indices (it had refused such a checkpoint at every world size, the one that wrote it too).
TEST_CASE("a save whose ranks see the directory apart (a disk local to each host) publishes nothing, on every rank") {
  if (dist::world_size() == 1) return;  // one rank sees one directory
  const fs::path dir = shared_dir("apart"), other = shared_dir("apart_other");
  // The last rank has `other` mounted over `dir` in a mount namespace of its own (root only; else skipped, said).
  const bool last = dist::rank() == dist::world_size() - 1;
  Tensor ok = from_vector({1.0}, {1}, {.dtype = kFloat64});
  if (last && (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
               ::mount(other.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0))
    ok.fill_(0.0);
  dist::world()->all_reduce(ok, dist::ReduceOp::min)->wait();
  if (ok.item() == 0) {
    WARN("not run: the last rank cannot mount a directory over another in a namespace of its own (needs root)");
    return;
  }
  auto [m, root] = make_sharded<UnevenMLP>(2);
  CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 1}),
                    Catch::Contains(".tmp-step_00000001, which rank 0 made, is not there on this rank: every rank must "
                                    "see the same checkpoint directory"));
  // With a leftover of a killed save in the last rank's own directory, it had published the index beside rank 0's
  // file alone and returned (weft-checkpoint verify: a file missing).
  if (last) fs::create_directories(dir / ".tmp-step_00000001");
  barrier();
  CHECK_THROWS_WITH(fsdp::save_checkpoint(dir.string(), *m, nullptr, &root, {.step = 1}),
                    Catch::Contains("is missing in") && Catch::Contains("every rank must see the same checkpoint "
                                                                           "directory") &&
                        Catch::Contains("nothing was published"));
  barrier();
  CHECK(!fs::exists(dir / "step_00000001"));
  if (last) CHECK(::umount(dir.c_str()) == 0);
  barrier();
}

TEST_CASE("a checkpoint of a model with a 0-row parameter loads back") {
  fs::path dir = shared_dir("zero_rows");
  auto make = [] {
    auto m = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{std::make_shared<nn::Linear>(4, 3)});
    m->register_parameter("empty", zeros({0, 4}).set_requires_grad());
    return m;
  };
  auto m = make();
  fsdp::FSDPModule root = fsdp::fully_shard(m);
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  fsdp::save_checkpoint(dir.string(), *m, &opt, &root, {.step = 1});
  auto back = make();
  fsdp::FSDPModule back_root = fsdp::fully_shard(back);
  nn::AdamW back_opt(back->parameters(), {.lr = 1e-2});
  CHECK(fsdp::load_checkpoint(dir.string(), *back, &back_opt, &back_root).step == 1);
  for (auto& [name, t] : fsdp::full_state_dict(*back, &back_root)) CHECK(t.shape() == (name == "empty" ? Shape{0, 4} : t.shape()));
}

namespace {

// Four bias-free 64 x 64 Linears sharded over the world (one group), trained one AdamW step and saved to `dir`;
// then a fresh copy in `dtype` and its optimizer, for load_checkpoint.
struct Reloaded {
  std::shared_ptr<nn::Sequential> model;
  std::optional<fsdp::FSDPModule> root;
  std::unique_ptr<nn::AdamW> opt;
  int64_t shard_bytes = 0, largest = 0;  // of this rank's f32 shards: all, and the largest
};
Reloaded saved_and_fresh(const fs::path& dir, DType dtype) {
  Reloaded r;
  for (int copy = 0; copy < 2; ++copy) {
    manual_seed(5);
    r.model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Linear>(64, 64, false), std::make_shared<nn::Linear>(64, 64, false),
        std::make_shared<nn::Linear>(64, 64, false), std::make_shared<nn::Linear>(64, 64, false)});
    if (copy == 1) r.model->to(dtype);
    r.root = fsdp::fully_shard(r.model);
    r.opt = std::make_unique<nn::AdamW>(r.model->parameters(), nn::AdamWOptions{.lr = 1e-2});
    if (copy == 1) break;
    sum((*r.model)(ones({2, 64}))).backward();
    r.opt->step();
    fsdp::save_checkpoint(dir.string(), *r.model, r.opt.get(), &*r.root, {.step = 1});
  }
  for (const Tensor& p : r.model->parameters()) {
    r.shard_bytes += p.numel() * 4;
    r.largest = std::max(r.largest, p.numel() * 4);
  }
  return r;
}

}  // namespace

TEST_CASE("load_checkpoint keeps the optimizer state it reads and reads the model's values into the model") {
  fs::path dir = shared_dir("load_peak");
  Reloaded r = saved_and_fresh(dir, kFloat32);
  const int64_t start = memory_stats().live_bytes;
  reset_peak_memory_stats();
  REQUIRE(fsdp::load_checkpoint(dir.string(), *r.model, r.opt.get(), &*r.root).step == 1);
  const int64_t held = memory_stats().live_bytes - start, peak = memory_stats().peak_bytes - start;
  INFO("shards " << r.shard_bytes << " bytes (largest " << r.largest << "); held after the load " << held
                 << ", peak " << peak);
  CHECK(held == 2 * r.shard_bytes + 4 * 4);  // exp_avg, exp_avg_sq and four step counts
  // No second copy of the state (the optimizer's own) nor of the model (values read before any is placed): at most
  // one tensor beside them (the piece read for it), and the checkpoint's scalars.
  CHECK(peak <= 2 * r.shard_bytes + r.largest + 256);
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}

TEST_CASE("a checkpoint's optimizer state that runs out of memory in the optimizer says so, as itself") {
  fs::path dir = shared_dir("load_oom");
  Reloaded r = saved_and_fresh(dir, kFloat64);  // the f32 state is converted to the parameters' f64 as it is loaded
  // Room to read it all, not to convert it.
  set_memory_limit(Device::cpu(), memory_stats().live_bytes + 2 * r.shard_bytes + r.largest + 1024);
  std::string message;
  try {
    fsdp::load_checkpoint(dir.string(), *r.model, r.opt.get(), &*r.root);
  } catch (const Error& e) {
    message = e.what();
  }
  set_memory_limit(Device::cpu(), 0);
  CHECK_THAT(message, Contains("out of memory on cpu"));
  CHECK_THAT(message, !Contains("does not fit this optimizer"));
  barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
}
