// weft-bench-memory: peak memory per rank of FSDP training against FSDP2's memory formulas. Builds the GPT of
// apps/transformer, shards it (fully_shard per block, then the root), trains a few AdamW steps in fp32 on random tokens
// with a fixed batch per rank, and reads the CPU allocator: its peak per phase, and its timeline of live bytes
// (start_memory_recording) for plots. Run it at several world sizes, then combine the JSON files into one table:
//   mpirun -np 2 --oversubscribe --bind-to none weft-bench-memory --json np2.json
//   weft-bench-memory --summary np1.json np2.json np4.json
// scripts/bench_memory.sh runs 1, 2 and 4 ranks, the summary and the plot (docs/MEMORY_SCALING.md).
//
// The bound (fp32, Adam; P all parameter bytes, B one block's, E the root's own, Ps this rank's shards, padding
// included; L blocks; A the activations, measured): FSDP2's forward <= 3B + E + Ps and backward <= 4B + E + 2Ps, plus
// Adam's 2Ps once the first step has made it, plus the activations. The largest is backward from the second step. Its
// activation part is A, alive when backward starts, plus the gradients a block's backward holds at once, at most the
// size of that block's activations, taken as A / L (an over-estimate: A also holds the embeddings' output and the
// logits). Printed beside each peak: 4B + E + 4Ps + A + A/L. A is measured on each rank, each step: live bytes after
// the loss minus live bytes before the forward, minus E (the root's gathered parameters, which stay for backward).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/common/cli.h"
#include "apps/common/output_paths.h"
#include "apps/transformer/gpt.h"
#include "core/allocator.h"
#include "dist/dist.h"
#include "fsdp/fsdp.h"
#include "weft.h"

using namespace weft;
using json = nlohmann::json;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

struct Options {
  // nanofsdp's chart shape (32 layers, d_model 1024, ctx 256) with d_model and ctx halved; see
  // docs/MEMORY_SCALING.md for the choice of the batch.
  apps::ModelConfig model{.ctx = 128, .n_layer = 32, .n_head = 8, .d_model = 512};
  int64_t batch = 4;  // sequences per rank per step
  int64_t steps = 5;
  uint64_t seed = 0;
  int threads = 0;
  int64_t series_points = 3000;
  std::string json_path;
  std::vector<std::string> summary;
  bool check = false;
  bool activation_checkpointing = false;
  bool deferred_init = false;  // build on the meta device; fully_shard initialises the shards
};

int64_t bytes_of(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (auto& t : ts) n += int64_t(t.nbytes());
  return n;
}

int64_t live() { return memory_stats().live_bytes; }
int64_t peak() { return memory_stats().peak_bytes; }
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The timeline reduced to at most `points` time bins, each with the smallest and largest live
// bytes recorded in it (so every peak survives the reduction), in MiB, times in s from t0.
json reduce_timeline(const MemoryTimeline& tl, int64_t t0, int64_t t_end, int64_t points) {
  json t = json::array(), lo = json::array(), hi = json::array();
  const double width = std::max<double>(1.0, double(t_end - t0) / double(points));
  int64_t bin = -1, bmin = 0, bmax = 0;
  auto flush = [&] {
    if (bin < 0) return;
    t.push_back(double(bin) * width * 1e-9);
    lo.push_back(double(bmin) / kMiB);
    hi.push_back(double(bmax) / kMiB);
  };
  for (auto& s : tl.samples) {
    int64_t b = int64_t(double(std::max<int64_t>(0, s.t_ns - t0)) / width);
    if (b != bin) {
      flush();
      bin = b;
      bmin = bmax = s.live_bytes;
    }
    bmin = std::min(bmin, s.live_bytes);
    bmax = std::max(bmax, s.live_bytes);
  }
  flush();
  return {{"t_s", t}, {"min_mib", lo}, {"max_mib", hi}};
}

// Every rank's JSON text gathered to rank 0 (others get an empty list).
std::vector<json> gather_to_lead(const json& mine) {
  std::string text = mine.dump();
  int n = dist::world_size(), me = dist::rank();
  int len = int(text.size());
  std::vector<int> lens(size_t(n), 0), offs(size_t(n), 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int total = 0;
  for (int r = 0; r < n; ++r) offs[size_t(r)] = total, total += lens[size_t(r)];
  std::string all(me == 0 ? size_t(total) : 0, '\0');
  MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<json> out;
  if (me == 0)
    for (int r = 0; r < n; ++r) out.push_back(json::parse(all.substr(size_t(offs[size_t(r)]), size_t(lens[size_t(r)]))));
  return out;
}

// The timeline's phase marks, in s from the start of the recording.
struct Events {
  int64_t t0 = now_ns();
  json marks = json::array();
  void mark(int64_t step, const char* phase) {
    marks.push_back({{"step", step}, {"phase", phase}, {"t_s", double(now_ns() - t0) * 1e-9}});
  }
};

// The parameter bytes the bound is made of (see the header comment).
struct Sizes {
  int64_t P = 0, B = 0, E = 0;
  int64_t Ps = 0;  // this rank's shards, padding included
};

// Init: the full model on every rank (same seed, same weights), then sharded block by block
// and the root; or, with --deferred-init (as weft-transformer --fsdp does), the model built
// on the meta device and only this rank's shards allocated and initialised by fully_shard.
std::shared_ptr<apps::GPT> sharded_gpt(const Options& o, Sizes& s) {
  manual_seed(o.seed);
  std::shared_ptr<apps::GPT> model;
  {
    std::optional<DefaultDeviceGuard> meta;
    if (o.deferred_init) meta.emplace(Device::meta());
    model = std::make_shared<apps::GPT>(o.model);
    apps::init_gpt(*model);
  }
  s.P = bytes_of(model->parameters());
  s.B = bytes_of(model->blocks.front()->parameters());
  s.E = s.P - s.B * o.model.n_layer;
  for (auto& block : model->blocks) {
    block->set_activation_checkpointing(o.activation_checkpointing);
    fsdp::fully_shard(block);
  }
  fsdp::fully_shard(model);
  s.Ps = bytes_of(model->parameters());
  return model;
}

struct Phase {
  const char* name;
  int64_t peak = 0;  // bytes above the baseline
};

// Each phase's largest peak over the steps, the largest of them all, and every step's figures.
struct Training {
  std::vector<Phase> worst = {{"forward"}, {"backward"}, {"step"}};
  json steps = json::array();
  int64_t act_max = 0, peak = 0;
  const char* peak_phase = "";
};

Training train(const Options& o, apps::GPT& model, nn::AdamW& opt, int64_t E, int64_t base, Events& events) {
  Generator gen(o.seed + 1000003ull * uint64_t(dist::rank() + 1));  // each rank its own rows
  Training tr;
  for (int64_t step = 0; step < o.steps; ++step) {
    events.mark(step, "forward");
    opt.zero_grad();
    Tensor x = (rand({o.batch, o.model.ctx}, {}, &gen) * double(o.model.vocab_size)).to(kInt64);
    Tensor y = (rand({o.batch, o.model.ctx}, {}, &gen) * double(o.model.vocab_size)).to(kInt64);
    reset_peak_memory_stats();
    const int64_t before = live();
    Tensor loss = cross_entropy(model(x).view({-1, o.model.vocab_size}), y.view({-1}));
    const int64_t act = live() - before - E;  // the root's E stays gathered into backward
    const int64_t fwd = peak() - base;
    events.mark(step, "backward");
    reset_peak_memory_stats();
    loss.backward();
    loss = Tensor();
    const int64_t bwd = peak() - base;
    events.mark(step, "step");
    reset_peak_memory_stats();
    opt.step();
    const int64_t stp = peak() - base;
    const int64_t after = live() - base;
    x = y = Tensor();
    tr.act_max = std::max(tr.act_max, act);
    int64_t phase_peaks[3] = {fwd, bwd, stp};
    for (int i = 0; i < 3; ++i) {
      tr.worst[size_t(i)].peak = std::max(tr.worst[size_t(i)].peak, phase_peaks[i]);
      if (phase_peaks[i] > tr.peak) tr.peak = phase_peaks[i], tr.peak_phase = tr.worst[size_t(i)].name;
    }
    tr.steps.push_back({{"step", step}, {"activations", act}, {"forward_peak", fwd}, {"backward_peak", bwd},
                        {"step_peak", stp}, {"after_step", after}});
  }
  return tr;
}

// This rank's figures, its bounds and its timeline reduced to --series-points bins.
json rank_record(const Options& o, const Sizes& s, const Training& tr, int64_t init_peak, int64_t base,
                 const Events& events, int64_t t_end, const MemoryTimeline& tl) {
  int64_t timeline_max = 0;
  for (auto& sample : tl.samples) timeline_max = std::max(timeline_max, sample.live_bytes - base);
  // FSDP2's bounds (see the header comment); Adam's 2Ps from the second step on.
  const int64_t params_bound = 4 * s.B + s.E + 4 * s.Ps;
  const int64_t bound = params_bound + tr.act_max + tr.act_max / o.model.n_layer;
  const int64_t init_bound = s.Ps + s.B + (1 << 20);  // the init bound Ps + B, 1 MiB of slack
  return {{"rank", dist::rank()},
          {"deferred_init", o.deferred_init},
          {"init_bound", init_bound},
          {"Ps", s.Ps},
          {"init_peak", init_peak},
          {"train_peak", tr.peak},
          {"train_peak_phase", tr.peak_phase},
          {"forward_peak", tr.worst[0].peak},
          {"backward_peak", tr.worst[1].peak},
          {"step_peak", tr.worst[2].peak},
          {"activations", tr.act_max},
          {"params_bound", params_bound},
          {"bound", bound},
          {"timeline_max", timeline_max},
          {"timeline_samples", tl.samples.size()},
          {"timeline_dropped", tl.dropped},
          {"steps", tr.steps},
          {"events", events.marks},
          {"series", reduce_timeline(tl, events.t0, t_end, o.series_points)}};
}

double mib(const json& v) { return v.get<double>() / kMiB; }

// The rank with the largest training peak (the first of equals).
json worst_rank(const json& ranks) {
  json w = ranks.front();
  for (auto& r : ranks)
    if (r["train_peak"].get<int64_t>() > w["train_peak"].get<int64_t>()) w = r;
  return w;
}

void print_header(const Options& o, const Sizes& s) {
  std::printf("# weft-bench-memory: GPT n_layer %lld, d_model %lld, n_head %lld, ctx %lld, vocab %lld; fp32, "
              "AdamW, fully_shard per block + root%s; %lld steps, batch %lld x %lld tokens per rank; %d rank(s)\n",
              (long long)o.model.n_layer, (long long)o.model.d_model, (long long)o.model.n_head,
              (long long)o.model.ctx, (long long)o.model.vocab_size,
              (std::string(o.activation_checkpointing ? ", activation checkpointing per block" : "") +
               (o.deferred_init ? ", deferred init" : "")).c_str(), (long long)o.steps, (long long)o.batch,
              (long long)o.model.ctx, dist::world_size());
  std::printf("# P %.2f MiB (%lld parameters), B %.2f MiB per block, E %.2f MiB outside the blocks (MiB = 2^20 "
              "bytes)\n", s.P / kMiB, (long long)(s.P / 4), s.B / kMiB, s.E / kMiB);
  std::printf("| rank | Ps | init peak | forward peak | backward peak | step peak | activations A | 4B+E+4Ps "
              "| bound 4B+E+4Ps+A+A/L | train peak / bound | timeline max |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
}

// Prints rank r's row and its checks; returns how many of them failed.
int print_rank(const Options& o, const json& r) {
  int failed = 0;
  std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f | %.2f |\n",
              r["rank"].get<int>(), mib(r["Ps"]), mib(r["init_peak"]), mib(r["forward_peak"]),
              mib(r["backward_peak"]), mib(r["step_peak"]), mib(r["activations"]), mib(r["params_bound"]),
              mib(r["bound"]), r["train_peak"].get<double>() / r["bound"].get<double>(), mib(r["timeline_max"]));
  // The timeline holds every change, so its largest sample is the allocator's own peak.
  int64_t over_all = std::max({r["init_peak"].get<int64_t>(), r["train_peak"].get<int64_t>()});
  if (r["timeline_dropped"].get<int64_t>() == 0 && r["timeline_max"].get<int64_t>() != over_all) {
    std::printf("CHECK FAILED: rank %d: timeline max %lld bytes != allocator peak %lld bytes\n",
                r["rank"].get<int>(), (long long)r["timeline_max"].get<int64_t>(), (long long)over_all);
    ++failed;
  }
  if (r.value("deferred_init", false) && r["init_peak"].get<int64_t>() > r.value("init_bound", int64_t(0))) {
    std::printf("%s: rank %d: deferred init peak %.2f MiB exceeds the bound Ps+B (+1 MiB) = %.2f MiB\n",
                o.check ? "CHECK FAILED" : "note", r["rank"].get<int>(), mib(r["init_peak"]), mib(r["init_bound"]));
    if (o.check) ++failed;
  }
  if (r["train_peak"].get<int64_t>() > r["bound"].get<int64_t>()) {
    std::printf("%s: rank %d: training peak %.2f MiB exceeds the bound 4B+E+4Ps+A+A/L = %.2f MiB\n",
                o.check ? "CHECK FAILED" : "note", r["rank"].get<int>(), mib(r["train_peak"]), mib(r["bound"]));
    if (o.check) ++failed;
  }
  return failed;
}

// Rank 0: the table of every rank, its checks and the --json file; returns how many checks failed.
int report(const Options& o, const Sizes& s, const std::vector<json>& ranks) {
  json summary = {{"world", dist::world_size()},
                  {"n_layer", o.model.n_layer},
                  {"d_model", o.model.d_model},
                  {"n_head", o.model.n_head},
                  {"ctx", o.model.ctx},
                  {"vocab", o.model.vocab_size},
                  {"batch_per_rank", o.batch},
                  {"steps", o.steps},
                  {"P", s.P},
                  {"B", s.B},
                  {"E", s.E},
                  {"ranks", ranks}};
  print_header(o, s);
  int failed = 0;
  for (auto& r : ranks) failed += print_rank(o, r);
  const json w = worst_rank(summary["ranks"]);
  std::printf("peak per rank (max over ranks): %.2f MiB in %s on rank %d; bound 4B+E+4Ps %.2f + A(1+1/L) %.2f = "
              "%.2f MiB\n", mib(w["train_peak"]), w["train_peak_phase"].get<std::string>().c_str(),
              w["rank"].get<int>(), mib(w["params_bound"]), mib(w["bound"]) - mib(w["params_bound"]), mib(w["bound"]));
  std::fflush(stdout);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << summary.dump() << "\n";
    WEFT_CHECK(f.good(), "weft-bench-memory: could not write {}", o.json_path);
  }
  return failed;
}

int run(const Options& o) {
  dist::init();
  if (o.threads > 0) set_num_threads(o.threads);
  apps::check_config(o.model);
  apps::check_outputs_apart({{"--json", o.json_path}}, {}, "weft-bench-memory");  // its place, before the run

  // Everything is measured above what this process held before the model existed.
  MPI_Barrier(MPI_COMM_WORLD);
  const int64_t base = live();
  reset_peak_memory_stats();
  start_memory_recording();
  Events events;
  events.mark(-1, "init");
  Sizes sizes;
  std::shared_ptr<apps::GPT> model = sharded_gpt(o, sizes);
  nn::AdamW opt(model->parameters(), nn::AdamWOptions{.lr = 3e-4, .weight_decay = 0.1});
  const int64_t init_peak = peak() - base;
  const Training tr = train(o, *model, opt, sizes.E, base, events);
  events.mark(o.steps, "end");
  const int64_t t_end = now_ns();
  // The timeline is freed as soon as it is reduced, before the gather.
  const json mine = rank_record(o, sizes, tr, init_peak, base, events, t_end, stop_memory_recording());
  std::vector<json> ranks = gather_to_lead(mine);
  int failed = dist::rank() == 0 ? report(o, sizes, ranks) : 0;
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dist::finalize();
  return failed ? 1 : 0;
}

// The table over world sizes from the JSON files of single runs.
int summarize(const std::vector<std::string>& paths) {
  std::vector<json> runs;
  for (auto& p : paths) {
    std::ifstream f(p);
    WEFT_CHECK(f.good(), "weft-bench-memory: cannot read {}", p);
    json j;
    try {
      f >> j;
      (void)j.at("world").get<int>();
      (void)j.at("ranks").at(0).at("train_peak").get<int64_t>();
    } catch (const json::exception& e) {
      WEFT_ERROR("weft-bench-memory: {} is not a weft-bench-memory --json file ({})", p, e.what());
    }
    runs.push_back(std::move(j));
  }
  std::sort(runs.begin(), runs.end(), [](const json& a, const json& b) { return a["world"] < b["world"]; });
  for (size_t i = 1; i < runs.size(); ++i)
    WEFT_CHECK(runs[i]["world"] != runs[i - 1]["world"], "weft-bench-memory: two files of {} ranks (a file given twice?): "
               "the table has one row a world size", runs[i]["world"].get<int>());
  const json& first = runs.front();
  for (auto& r : runs)
    WEFT_CHECK(r["n_layer"] == first["n_layer"] && r["d_model"] == first["d_model"] && r["ctx"] == first["ctx"] &&
                   r["batch_per_rank"] == first["batch_per_rank"],
               "weft-bench-memory: the files describe different models or batches; compare like with like");
  const double base = runs.front()["world"] == 1 ? worst_rank(runs.front()["ranks"])["train_peak"].get<double>() : 0;
  std::printf("| ranks | Ps | activations A | peak per rank (max over ranks) | phase | 4B+E+4Ps | bound 4B+E+4Ps+A+A/L "
              "| peak / bound | peak / 1 rank | bound / 1 rank |\n");
  std::printf("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n");
  const double base_bound = runs.front()["world"] == 1 ? worst_rank(runs.front()["ranks"])["bound"].get<double>() : 0;
  for (auto& run : runs) {
    json w = worst_rank(run["ranks"]);
    double pk = w["train_peak"].get<double>(), bd = w["bound"].get<double>();
    std::string ratio = base > 0 ? fmt::format("{:.2f}", pk / base) : "-";
    std::string bratio = base_bound > 0 ? fmt::format("{:.2f}", bd / base_bound) : "-";
    std::printf("| %d | %.1f | %.1f | %.1f | %s | %.1f | %.1f | %.3f | %s | %s |\n", run["world"].get<int>(),
                w["Ps"].get<double>() / kMiB, w["activations"].get<double>() / kMiB, pk / kMiB,
                w["train_peak_phase"].get<std::string>().c_str(), w["params_bound"].get<double>() / kMiB, bd / kMiB,
                pk / bd, ratio.c_str(), bratio.c_str());
  }
  std::printf("(MiB; P %.1f, B %.2f, E %.2f MiB; GPT n_layer %lld, d_model %lld, ctx %lld, batch %lld per rank)\n",
              first["P"].get<double>() / kMiB, first["B"].get<double>() / kMiB, first["E"].get<double>() / kMiB,
              (long long)first["n_layer"].get<int64_t>(), (long long)first["d_model"].get<int64_t>(),
              (long long)first["ctx"].get<int64_t>(), (long long)first["batch_per_rank"].get<int64_t>());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench-memory: peak memory per rank of FSDP training (GPT, fp32, AdamW) beside FSDP2's bounds; "
               "run under mpirun, or --summary to combine runs"};
  Options o;
  app.add_option("--n-layer", o.model.n_layer, "transformer blocks")->check(apps::cli::integer(1, apps::kMaxLayers))->capture_default_str();
  app.add_option("--d-model", o.model.d_model, "embedding width")->check(apps::cli::integer(1, apps::kMaxDModel))->capture_default_str();
  app.add_option("--n-head", o.model.n_head, "attention heads (must divide --d-model)")
      ->check(apps::cli::integer(1, apps::kMaxHeads))->capture_default_str();
  app.add_option("--ctx", o.model.ctx, "tokens per sequence")->check(apps::cli::integer(1, apps::kMaxCtx))->capture_default_str();
  app.add_option("--batch-size", o.batch, "sequences per rank per step (fixed per rank, as data parallel scales)")
      ->check(apps::cli::integer(1, int64_t(1) << 30))->capture_default_str();
  app.add_option("--steps", o.steps, "training steps (at least 2: the bound's peak is a step's after Adam's state exists)")
      ->check(apps::cli::integer(2, 1000))->capture_default_str();
  app.add_option("--seed", o.seed, "seed for the weights and the tokens")->check(apps::cli::seed())->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (default: OMP_NUM_THREADS or all cores)")
      ->check(apps::cli::threads());
  app.add_option("--json", o.json_path, "write the figures and each rank's memory timeline to FILE (rank 0)");
  app.add_option("--series-points", o.series_points, "time bins per rank in the JSON timeline (each keeps min and max)")
      ->check(apps::cli::integer(10, 1000000))->capture_default_str();
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "recompute each block in backward (the activations A then hold only the blocks' inputs)");
  app.add_flag("--deferred-init", o.deferred_init,
               "build the model on the meta device: fully_shard allocates and initialises only this rank's shards "
               "(with --check: init peak <= Ps + B + 1 MiB)");
  app.add_flag("--check", o.check, "exit 1 if a rank's training peak exceeds the bound 4B+E+4Ps+A+A/L");
  app.add_option("--summary", o.summary, "print the table over world sizes from --json files of earlier runs and exit")
      ->expected(1, -1)->check(CLI::ExistingFile);
  CLI11_PARSE(app, argc, argv);
  try {
    if (!o.summary.empty()) return summarize(o.summary);
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weft-bench-memory: error: %s\n", e.what());
    // Every rank fails the same flag checks; anything else may leave other ranks waiting.
    if (dist::is_initialized() && dist::world_size() > 1) dist::abort_job(fmt::format("weft-bench-memory: {}", e.what()));
    if (dist::is_initialized()) dist::finalize();
    return 1;
  }
}
