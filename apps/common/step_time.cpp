#include "apps/common/step_time.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <thread>
#include <tuple>

#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/op_profiler.h"
#include "core/tensor.h"
#include "dist/device_mesh.h"
#include "dist/dist.h"
#include "kernels/attention.h"
#include "kernels/linalg.h"
#include "kernels/threads.h"

namespace weft::apps {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Times calls for the calibration (after one untimed call). In one process: the best of three
// rounds of 5 ms or more. Under mpirun (every rank calibrating the same trace): all ranks start
// together and make the same number of calls (`target` seconds' worth), each taking its mean,
// so ranks beyond the machine's cores slow each other as they do in the step.
struct Timer {
  dist::ProcessGroupPtr world;  // null: one process
  double target = 0.25;         // under mpirun: seconds of calls to time
  double seconds(const std::function<void()>& f) const {
    f();
    if (world) {
      const auto t0 = Clock::now();
      f();
      Tensor calls = from_vector({std::ceil(target / std::max(since(t0), 1e-7))}, {1}, {.dtype = kFloat64});
      world->all_reduce(calls, dist::ReduceOp::max)->wait();
      const int n = int(std::min(calls.item(), 1e4));
      world->barrier()->wait();
      const auto t1 = Clock::now();
      for (int i = 0; i < n; ++i) f();
      return since(t1) / n;
    }
    double best = std::numeric_limits<double>::infinity();
    for (int round = 0; round < 3; ++round) {
      const auto t0 = Clock::now();
      int calls = 0;
      do f(), ++calls;
      while (since(t0) < 5e-3);
      best = std::min(best, since(t0) / calls);
    }
    return best;
  }
};

// The median of three measurements (a loaded machine's outliers left out).
double median_of_3(const std::function<double()>& measure) {
  std::array<double, 3> m{measure(), measure(), measure()};
  std::sort(m.begin(), m.end());
  return m[1];
}

DType dtype_named(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64})
    if (dtype_name(t) == name) return t;
  WEFT_ERROR("step-time calibration: no dtype named \"{}\"", name);
}

Tensor random(const Shape& shape, DType dtype) { return randn(shape).to(dtype); }

// A call of the op the trace names, replayed on the CPU, and the FLOPs it does; nullopt for names
// that carry no shape. "OP MxNxK TT dtype" (GEMMs: a batched one's replay is one 2 m n k product
// of the batch), "attention[_backward] BxHxHkvxTqxTkxE[ causal] dtype" (the trace's FLOPs, `flops`).
struct Replay {
  std::function<void()> call;
  double flops = 0;
};
std::optional<Replay> replay(const std::string& name, double flops, int64_t working_bytes) {
  static const std::regex gemm(R"(^\S+ (\d+)x(\d+)x(\d+) ([NT])([NT]) (\S+)$)");
  static const std::regex attention(R"(^(attention|attention_backward) (\d+)x(\d+)x(\d+)x(\d+)x(\d+)x(\d+)( causal)? (\S+)$)");
  std::smatch m;
  auto num = [&m](int i) { return int64_t(std::stoll(m[i].str())); };
  if (std::regex_match(name, m, gemm)) {
    const int64_t rows = num(1), cols = num(2), inner = num(3);
    const bool ta = m[4] == "T", tb = m[5] == "T";
    const DType dt = dtype_named(m[6]);
    // As in the step: operands read from memory (copies, 64 MiB together, taken in turn: more than the caches hold; at
    // most half the step's peak) and a fresh output each call (allocation, first touches, free).
    const int64_t pair_bytes = (rows + cols) * inner * int64_t(dtype_size(dt));
    const int64_t pool = std::min(int64_t(64) << 20, working_bytes / 2);
    std::vector<std::pair<Tensor, Tensor>> operands(size_t(std::clamp<int64_t>(pool / pair_bytes, 1, 64)));
    for (auto& [a, b] : operands)
      a = ta ? random({inner, rows}, dt) : random({rows, inner}, dt), b = tb ? random({cols, inner}, dt) : random({inner, cols}, dt);
    return Replay{[=, next = size_t(0)]() mutable {
                    const auto& [a, b] = operands[next++ % operands.size()];
                    kernels::gemm(a, ta, b, tb, empty({rows, cols}, {.dtype = is_16bit(dt) ? kFloat32 : dt}));
                  },
                  2.0 * double(rows * cols * inner)};
  }
  if (!std::regex_match(name, m, attention)) return std::nullopt;
  const bool causal = m[8].matched;
  const DType dt = dtype_named(m[9]);
  Tensor q = random({num(2), num(3), num(5), num(7)}, dt), k = random({num(2), num(4), num(6), num(7)}, dt),
         v = random({num(2), num(4), num(6), num(7)}, dt);
  const double scale = 1.0 / std::sqrt(double(num(7)));
  auto [out, lse] = kernels::attention(q, k, v, causal, scale);
  if (m[1] == "attention") return Replay{[=] { kernels::attention(q, k, v, causal, scale); }, flops};
  Tensor grad = random(out.shape(), dt);
  return Replay{[=] { kernels::attention_backward(grad, q, k, v, out, lse, causal, scale); }, flops};
}

// The element-wise rate and the framework's time per op, from a chain of autograd ops on distinct tensors of the
// byte-weighted median size of the trace's ops without FLOPs (the element-wise share of a step runs at about their
// size), forward and backward under the op profiler: the ops' own time over their operand bytes, and the rest of the
// chain's time (autograd, allocation, dispatch) over its ops. The round of the median rate of three (a later round may
// find the allocator's pages already touched, an earlier one pays for them).
std::pair<double, double> elementwise_and_framework(const std::vector<step_trace::Event>& trace, const Timer& timer,
                                                    int64_t working_bytes) {
  std::vector<double> sizes;
  double total = 0, median = 1 << 20, seen = 0;
  for (const auto& e : trace)
    if (e.kind == step_trace::Event::Kind::op && e.flops == 0) sizes.push_back(e.bytes), total += e.bytes;
  std::sort(sizes.begin(), sizes.end());
  for (size_t i = 0; i < sizes.size() && seen < total / 2; ++i) median = sizes[i], seen += sizes[i];
  const int64_t n = std::clamp<int64_t>(int64_t(median / 12), 1 << 10, int64_t(1) << 26);
  // Distinct operands: with the chain's outputs and gradients (three times theirs) as many bytes
  // as the step works in (its predicted peak, at most 256 MiB), so the caches hold as much of them
  // as of the step's activations, and the calibration stays within the plan.
  std::vector<Tensor> xs(size_t(std::clamp<int64_t>(std::min(working_bytes, int64_t(256) << 20) / 12 / n, 4, 128)));
  for (Tensor& x : xs) x = randn({n}, {.requires_grad = true});
  std::vector<std::pair<double, double>> rounds;  // (rate, seconds per op)
  for (int round = 0; round < 3; ++round) {
    if (timer.world) timer.world->barrier()->wait();
    op_profiler::start();
    const auto t0 = Clock::now();
    Tensor y = xs[0];
    for (const Tensor& x : xs) y = y * x + x;
    sum(y).backward();
    const double wall = since(t0);
    op_profiler::stop();
    double seconds = 0, bytes = 0, ops = 0;
    for (const auto& row : op_profiler::rows()) seconds += row.seconds, bytes += row.bytes, ops += double(row.calls);
    rounds.push_back({bytes / seconds, (wall - seconds) / ops});
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[1];
}

const std::regex& network_form() {
  static const std::regex form(R"(^([0-9]+(?:\.[0-9]+)?)(?:,([0-9]+(?:\.[0-9]+)?))?$)");
  return form;
}

// The link GBPS[,LATENCY_US] (5 us unless given), bandwidth above 0, both in range (strtod: no ERANGE); else none.
std::optional<std::pair<double, double>> link_of(const std::string& text) {
  std::smatch m;
  auto num = [&m](int i) { return std::strtod(m[i].str().c_str(), nullptr); };
  errno = 0;
  if (!std::regex_match(text, m, network_form())) return std::nullopt;
  const double gbps = num(1), us = m[2].matched ? num(2) : 5.0;
  return errno == ERANGE || !(gbps > 0) ? std::nullopt : std::optional(std::pair{gbps, us});
}

std::string network_error(const std::string& text) {
  return link_of(text) ? "" : fmt::format("expected GBPS[,LATENCY_US]: a bandwidth in Gb/s above 0 and optionally a "
                                          "latency in microseconds, each a plain decimal (e.g. 100 or 100,5), got "
                                          "\"{}\"", text);
}

}  // namespace

void add_step_time_flags(CLI::App& cmd, StepTimeFlags& f) {
  cmd.add_flag("--step-time", f.wanted,
               "with --plan, --plan-ranks or --memory-budget: predict the step's time from this machine's measured compute "
               "and the network (docs/PARALLEL.md, \"Step-time model\")");
  // Checked as the flags are read, before any plan is made.
  const CLI::Validator link([](std::string& text) { return network_error(text); }, "GBPS[,LATENCY_US]");
  cmd.add_option("--network", f.network,
                 "the network --step-time assumes, GBPS[,LATENCY_US] (e.g. 100,5); default: measured on this run's ranks")
      ->check(link);
  cmd.add_option("--tp-network", f.tp_network,
                 "a link of their own for the tensor-parallel groups' collectives (inside a node), GBPS[,LATENCY_US] "
                 "(e.g. 400,1); default: --network's")->check(link);
}

fsdp::Link parse_network(const std::string& text, const std::string& flag) {
  const auto link = link_of(text);
  WEFT_CHECK(link, "{}: {}", flag, network_error(text));
  return {.latency_seconds = link->second * 1e-6, .bytes_per_second = link->first * 1e9 / 8};
}

fsdp::Link measure_link() {
  auto world = dist::world();
  const int n = world->size();
  auto seconds = [&](int64_t bytes) {
    Tensor in = zeros({bytes / 4 / n}), out = zeros({n * (bytes / 4 / n)});
    const Timer timer{world, 0.1};
    Tensor t = from_vector({median_of_3([&] { return timer.seconds([&] { world->all_gather_into_tensor(out, in)->wait(); }); })},
                           {1}, {.dtype = kFloat64});
    world->all_reduce(t, dist::ReduceOp::max)->wait();  // every rank fits the same link
    return std::pair{double((bytes / 4 / n) * 4 * n), t.item()};
  };
  const auto [s1, t1] = seconds(int64_t(4) << 10);
  const auto [s2, t2] = seconds(int64_t(8) << 20);
  WEFT_CHECK(t2 > t1, "--step-time: the network could not be measured: an all-gather of {} bytes took {:.1f} us, no longer "
             "than one of {} bytes ({:.1f} us; the machine busy elsewhere?): state it with --network GBPS[,LATENCY_US]",
             s2, t2 * 1e6, s1, t1 * 1e6);
  const double share = double(n - 1) / n;
  const double bandwidth = share * (s2 - s1) / (t2 - t1);
  return {.latency_seconds = std::max(0.0, (t1 - share * s1 / bandwidth) / (n - 1)), .bytes_per_second = bandwidth};
}

// How late the ranks of each group size the trace's collectives run on meet (fsdp::Meeting; where ranks share cores, a
// rank waits for the others' time slices): every rank runs the trace's heaviest GEMM, once or for the longest compute
// between two of that size's collectives, then all-gathers the median size of those collectives over groups of that
// size and waits, over and over (the same rounds on every rank; per point the median of three measurements); what a
// round takes beyond its GEMMs alone and the link's cost of the all-gather, the ranks' mean.
std::map<int, fsdp::Meeting> measure_meetings(const std::vector<step_trace::Event>& trace, const fsdp::ComputeRates& rates,
                                              const fsdp::Link& link, const dist::ProcessGroupPtr& world,
                                              int64_t working_bytes) {
  std::map<std::string, std::pair<double, double>> gemms;  // name -> (FLOPs in the step, of one call)
  std::map<int, std::pair<std::vector<double>, double>> sizes;  // group size -> (its collectives' bytes, longest compute before one)
  const std::vector<double> before = fsdp::compute_before_collectives(trace, rates);
  for (size_t i = 0; i < trace.size(); ++i) {
    const step_trace::Event& e = trace[i];
    if (e.kind == step_trace::Event::Kind::collective_start && e.group_size > 1) {
      auto& [bytes, longest] = sizes[e.group_size];
      bytes.push_back(e.bytes), longest = std::max(longest, before[i]);
    }
    if (e.kind == step_trace::Event::Kind::op && rates.flops_per_second.count(e.name))
      gemms[e.name].first += e.flops, gemms[e.name].second = e.flops;
  }
  std::map<int, fsdp::Meeting> meetings;
  if (gemms.empty()) return meetings;
  const auto heaviest = std::max_element(gemms.begin(), gemms.end(), [](auto& x, auto& y) { return x.second.first < y.second.first; });
  const std::optional<Replay> gemm = replay(heaviest->first, heaviest->second.second, working_bytes);
  const double gemm_seconds = gemm->flops / rates.flops_per_second.at(heaviest->first);
  const Timer timer{world, 0.25};
  for (auto& [size, collectives] : sizes) {
    auto& [bytes, longest] = collectives;
    WEFT_CHECK(world->size() % size == 0, "step-time calibration: a group of {} ranks in a world of {}", size, world->size());
    const dist::ProcessGroupPtr group = size == world->size() ? world : dist::DeviceMesh(DeviceType::cpu, {world->size() / size, size}).group(1);
    std::nth_element(bytes.begin(), bytes.begin() + bytes.size() / 2, bytes.end());
    Tensor in = zeros({std::max<int64_t>(1, int64_t(bytes[bytes.size() / 2] / 4 / size))}), out = zeros({in.numel() * size});
    Tensor most = from_vector({std::clamp(std::round(longest / gemm_seconds), 1.0, 1e3)}, {1}, {.dtype = kFloat64});
    world->all_reduce(most, dist::ReduceOp::max)->wait();  // every rank the same GEMMs per round
    std::vector<int> calls{1};
    if (most.item() > 1) calls.push_back(int(most.item()));
    const double moving = fsdp::collective_seconds("all_gather_into_tensor", 4.0 * double(out.numel()), size, link);
    std::vector<std::array<double, 3>> late(calls.size());
    for (int m = 0; m < 3; ++m) {
      const double alone = timer.seconds([&] { gemm->call(); });
      for (size_t c = 0; c < calls.size(); ++c)
        late[c][m] = timer.seconds([&] {
          for (int i = 0; i < calls[c]; ++i) gemm->call();
          group->all_gather_into_tensor(out, in)->wait();
        }) - calls[c] * alone - moving;
    }
    for (size_t c = 0; c < calls.size(); ++c) {
      std::sort(late[c].begin(), late[c].end());
      Tensor t = from_vector({late[c][1]}, {1}, {.dtype = kFloat64});
      world->all_reduce(t, dist::ReduceOp::sum)->wait();  // every rank predicts with the ranks' mean
      meetings[size].points.push_back({calls[c] * gemm_seconds, std::max(0.0, t.item() / world->size())});
    }
  }
  return meetings;
}

fsdp::ComputeRates calibrate_compute(const std::vector<step_trace::Event>& trace, const dist::ProcessGroupPtr& world,
                                     int64_t working_bytes) {
  const Timer timer{world}, shape_timer{world, 0.1};
  fsdp::ComputeRates r;
  double best = 0;
  for (const auto& e : trace) {
    if (e.kind != step_trace::Event::Kind::op || e.flops == 0 || r.flops_per_second.count(e.name)) continue;
    if (auto r1 = replay(e.name, e.flops, working_bytes)) {
      // The median of three (a time the machine was busy elsewhere left out).
      const double rate = r1->flops / median_of_3([&] { return shape_timer.seconds(r1->call); });
      r.flops_per_second[e.name] = rate;
      best = std::max(best, rate);
    }
  }
  if (best > 0) r.default_flops_per_second = best;
  std::tie(r.bytes_per_second, r.op_seconds) = elementwise_and_framework(trace, timer, working_bytes);
  if (!world) return r;
  // Every rank predicts with the ranks' mean time per FLOP, per byte and per op (each rank's own
  // scatters with how the machine's cores were shared while it measured).
  std::vector<double> times{1 / r.default_flops_per_second, 1 / r.bytes_per_second, r.op_seconds};
  for (const auto& [name, rate] : r.flops_per_second) times.push_back(1 / rate);
  Tensor t = from_vector(times, {int64_t(times.size())}, {.dtype = kFloat64});
  world->all_reduce(t, dist::ReduceOp::sum)->wait();
  const std::vector<double> mean = to_vector(t);
  auto at = [&](size_t i) { return mean[i] / world->size(); };
  r.default_flops_per_second = 1 / at(0), r.bytes_per_second = 1 / at(1), r.op_seconds = at(2);
  size_t i = 3;
  for (auto& [name, rate] : r.flops_per_second) rate = 1 / at(i++);
  return r;
}

void report_step_time(const StepTimeFlags& f, const fsdp::MemoryPlan& plan, const Ranks& ranks, int planned_ranks,
                      const StepItems& per_step, std::FILE* out, const std::string& program) {
  if (!f.wanted) return;
  const bool measured = f.network.empty();
  WEFT_CHECK(!measured || planned_ranks == ranks.world,
             "--step-time: planning {} ranks from {} process{} needs the network stated: add --network GBPS[,LATENCY_US]",
             planned_ranks, ranks.world, ranks.world == 1 ? "" : "es");
  fsdp::StepTimeModel model;
  model.link = !measured ? parse_network(f.network) : ranks.world > 1 ? measure_link() : fsdp::Link{};
  model.compute = calibrate_compute(plan.step, ranks.world > 1 ? dist::world() : nullptr, plan.peak_bytes);
  if (measured && ranks.world > 1)
    model.meetings = measure_meetings(plan.step, model.compute, model.link, dist::world(), plan.peak_bytes);
  reset_peak_memory_stats(Device::cpu());  // the run's peak, reported beside the plan's, is the training's
  // More ranks' threads than this host has cores: communication moves only while a rank waits.
  const int threads = ranks.world > 1 ? dist::local_size() * get_num_threads() : 0;
  const int cores = int(std::thread::hardware_concurrency());
  model.overlap = threads <= cores;
  if (!f.tp_network.empty()) model.group_links["tp"] = parse_network(f.tp_network, "--tp-network");  // the planner's tp groups
  const fsdp::StepTime t = fsdp::predict_step_time(plan.step, model);
  if (!ranks.lead()) return;
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  bool attention = false;  // weft-mnist's models have none
  for (const auto& [name, rate] : model.compute.flops_per_second)
    lo = std::min(lo, rate), hi = std::max(hi, rate), attention |= name.starts_with("attention");
  std::string kinds;
  for (const auto& [kind, s] : t.by_collective) kinds += fmt::format("{}{} {:.1f}", kinds.empty() ? "" : ", ", kind, s * 1e3);
  std::string tp_link;
  if (auto it = model.group_links.find("tp"); it != model.group_links.end())
    tp_link = fmt::format("; tensor-parallel link {:.2f} GB/s, {:.2f} us per hop (stated: --tp-network {})",
                          it->second.bytes_per_second / 1e9, it->second.latency_seconds * 1e6, f.tp_network);
  std::string meets = model.overlap ? "" : fmt::format("; collectives move only while waited for ({} threads on {} cores)", threads, cores);
  for (const auto& [size, meeting] : model.meetings)
    for (size_t i = 0; i < meeting.points.size(); ++i)
      meets += fmt::format("{} {:.0f} us {}after {:.1f} ms of compute", i ? "," : fmt::format("; {} ranks meet", size),
                           meeting.points[i].second * 1e6, i ? "" : "late ", meeting.points[i].first * 1e3);
  std::fprintf(out,
               "%s: step time predicted at %d rank%s: %.1f ms, %.0f %s/s\n"
               "  compute %.1f ms: FLOP-counted ops %.1f, element-wise %.1f, per op %.1f over %lld ops\n"
               "  communication %.1f ms in %lld collectives (%s), %.1f ms not hidden by compute\n"
               "  machine: %s %.1f-%.1f GFLOP/s over %zu shapes, element-wise %.2f GB/s, %.2f us per op; "
               "network %.2f GB/s per rank, %.2f us per hop%s (%s)%s\n",
               program.c_str(), planned_ranks, planned_ranks == 1 ? "" : "s", t.seconds * 1e3,
               per_step.count / t.seconds, per_step.what.c_str(), t.compute * 1e3, t.flops_ops * 1e3, t.bytes_ops * 1e3,
               t.per_op * 1e3, (long long)t.ops, t.communication * 1e3, (long long)t.collectives,
               kinds.empty() ? "none" : kinds.c_str(), std::max(0.0, t.exposed) * 1e3,
               attention ? "GEMM and attention" : "GEMM", hi > 0 ? lo / 1e9 : 0.0, hi / 1e9,
               model.compute.flops_per_second.size(), model.compute.bytes_per_second / 1e9, model.compute.op_seconds * 1e6,
               model.link.bytes_per_second / 1e9, model.link.latency_seconds * 1e6, meets.c_str(),
               !measured ? ("stated: --network " + f.network).c_str()
               : ranks.world > 1 ? fmt::format("measured on {} ranks", ranks.world).c_str() : "unused at one rank",
               tp_link.c_str());
  std::fflush(out);
}

}  // namespace weft::apps
