// The step-time model (fsdp/step_time.h) and its trace (core/step_trace.h): a meta step's trace
// holds the ops a CPU step runs, with the same FLOPs; a fake group's collectives appear where
// they start and where they are waited for; the model overlaps a prefetched collective with the
// compute between its start and its wait, serialises collectives on the link, and charges the
// ring's costs.
#include <map>

#include "core/op_profiler.h"
#include "core/step_trace.h"
#include "dist/fake_group.h"
#include "fsdp/step_time.h"
#include "nn/nn.h"
#include "test_util.h"

using namespace weft;
using Kind = step_trace::Event::Kind;

namespace {

// Two Linears and a ReLU, forward and backward, on `device`.
void mlp_step(Device device) {
  DefaultDeviceGuard on(device);
  manual_seed(3);
  nn::Linear a(32, 48), b(48, 16);
  Tensor x = randn({8, 32});
  sum(b(relu(a(x)))).backward();
}

step_trace::Event op(double flops, double bytes) { return {.kind = Kind::op, .name = "op", .flops = flops, .bytes = bytes}; }
step_trace::Event start(uint64_t id, double bytes, int ranks, std::string group = "dp") {
  return {.kind = Kind::collective_start, .name = "all_gather_into_tensor", .bytes = bytes, .id = id, .group_size = ranks,
          .group = std::move(group)};
}
step_trace::Event wait(uint64_t id) { return {.kind = Kind::collective_wait, .id = id}; }

}  // namespace

TEST_CASE("step trace: a meta step records the GEMMs a CPU step runs, with their FLOPs") {
  op_profiler::start();
  mlp_step(kCPU);
  op_profiler::stop();
  std::map<std::string, std::pair<int64_t, double>> cpu, meta;
  for (const auto& r : op_profiler::rows())
    if (r.flops > 0) cpu[r.name] = {r.calls, r.flops};
  {
    MetaComputeGuard shapes_only;
    step_trace::start();
    mlp_step(Device::meta());
    for (const auto& e : step_trace::stop()) {
      REQUIRE(e.kind == Kind::op);
      if (e.flops > 0) meta[e.name].first += 1, meta[e.name].second += e.flops;
    }
  }
  int64_t calls = 0;
  for (const auto& [name, calls_flops] : cpu) calls += calls_flops.first;
  REQUIRE(calls == 5);  // each Linear's forward and weight gradient, the second's input gradient
  for (const auto& [name, calls_flops] : cpu) {
    INFO(name);
    CHECK(meta[name] == calls_flops);
  }
  CHECK(meta.size() == cpu.size());
}

TEST_CASE("step trace: a fake group's collective starts at launch and ends where it is waited for; Pause leaves ops out") {
  auto group = dist::fake_group(0, 4, "dp");
  MetaComputeGuard shapes_only;
  DefaultDeviceGuard on_meta(Device::meta());
  Tensor in = empty({6}), out = empty({24});
  step_trace::start();
  auto work = group->all_gather_into_tensor(out, in);
  Tensor y = in * 2.0;
  {
    step_trace::Pause not_timed;
    Tensor z = in + 1.0;
  }
  work->wait();
  const auto events = step_trace::stop();
  REQUIRE(events.size() == 3);
  CHECK(events[0].kind == Kind::collective_start);
  CHECK(events[0].name == "all_gather_into_tensor");
  CHECK(events[0].bytes == 24 * 4);
  CHECK(events[0].group_size == 4);
  CHECK(events[0].group == "dp");
  CHECK(events[1].kind == Kind::op);
  CHECK(events[2].kind == Kind::collective_wait);
  CHECK(events[2].id == events[0].id);
  CHECK_FALSE(step_trace::recording());
}

TEST_CASE("step-time model: ring costs, a prefetched collective hidden by compute, collectives one after another") {
  const fsdp::Link link{.latency_seconds = 1e-3, .bytes_per_second = 1e6};
  const double s = 3e6;
  const double ring = 3 * 1e-3 + 0.75 * 3.0;  // (n - 1) a + (n - 1) / n S / B at n = 4
  CHECK(fsdp::collective_seconds("all_gather_into_tensor", s, 4, link) == Approx(ring));
  CHECK(fsdp::collective_seconds("reduce_scatter_tensor", s, 4, link) == Approx(ring));
  CHECK(fsdp::collective_seconds("all_reduce", s, 4, link) == Approx(2 * ring));  // ring beats doubling's 2 (a + S/B)
  CHECK(fsdp::collective_seconds("all_reduce", 8, 1024, link) == Approx(10 * (1e-3 + 8e-6)));  // doubling beats the ring
  CHECK(fsdp::collective_seconds("all_gather_into_tensor", s, 1, link) == 0);
  CHECK_THROWS_WITH(fsdp::collective_seconds("gossip", s, 4, link), Catch::Matchers::Contains("no cost for collective \"gossip\""));

  fsdp::StepTimeModel m{.compute = {.default_flops_per_second = 1e9, .bytes_per_second = 1e9, .op_seconds = 0}, .link = link};
  // Prefetched: the all-gather runs under 1 s of compute; the step waits only for the rest.
  auto t = fsdp::predict_step_time({start(1, s, 4), op(1e9, 0), wait(1)}, m);
  CHECK(t.seconds == Approx(ring));
  CHECK(t.compute == Approx(1.0));
  CHECK(t.exposed == Approx(ring - 1.0));
  // Waited for at once (a tensor-parallel all-reduce): nothing hides it.
  CHECK(fsdp::predict_step_time({start(1, s, 4), wait(1), op(1e9, 0)}, m).seconds == Approx(ring + 1.0));
  // Two collectives share the link: the second ends after both.
  CHECK(fsdp::predict_step_time({start(1, s, 4), start(2, s, 4), wait(2)}, m).seconds == Approx(2 * ring));
  // An op without FLOPs takes its bytes at the element-wise rate, plus the framework's time per op.
  m.compute.op_seconds = 0.5;
  CHECK(fsdp::predict_step_time({op(0, 2e9)}, m).seconds == Approx(2.5));
  m.compute.flops_per_second["op"] = 4e9;  // a measured rate for the op's name wins
  CHECK(fsdp::predict_step_time({op(1e9, 0)}, m).seconds == Approx(0.75));
  CHECK_THROWS_WITH(fsdp::predict_step_time({wait(9)}, m), Catch::Matchers::Contains("never started"));
}

TEST_CASE("step-time model: ranks meeting late delay a collective's end, not the link's next collective") {
  fsdp::StepTimeModel m{.compute = {.default_flops_per_second = 1e9, .bytes_per_second = 1e9, .op_seconds = 0},
                        .link = {.latency_seconds = 0, .bytes_per_second = 1e6}};
  m.meetings[4].points = {{1.0, 0.5}};
  const double ring = 0.75 * 2.0;  // 2e6 bytes over 4 ranks
  // Waited for at once after 1 s of compute: the step pays the meeting.
  CHECK(fsdp::predict_step_time({op(1e9, 0), start(1, 2e6, 4), wait(1)}, m).seconds == Approx(1 + ring + 0.5));
  // Only groups of the size it was measured for: a group of 2 meets at once.
  CHECK(fsdp::predict_step_time({op(1e9, 0), start(1, 2e6, 2), wait(1)}, m).seconds == Approx(1 + 0.5 * 2.0));
  // Two collectives in a row: the second starts on the link when the first's bytes are through.
  CHECK(fsdp::predict_step_time({op(1e9, 0), start(1, 2e6, 4), start(2, 2e6, 4), wait(1), wait(2)}, m).seconds ==
        Approx(1 + 2 * ring + 0.5));
  // Prefetched under enough compute, the meeting is hidden too.
  CHECK(fsdp::predict_step_time({op(1e9, 0), start(1, 2e6, 4), op(3e9, 0), wait(1)}, m).seconds == Approx(4.0));
}

TEST_CASE("step-time model: how late ranks meet grows with the compute since their group's last collective") {
  const fsdp::Meeting meeting{.points = {{1.0, 0.5}, {3.0, 0.9}}};
  CHECK(meeting.late(0.5) == Approx(0.5));   // the first point's below it
  CHECK(meeting.late(2.0) == Approx(0.7));   // between the points
  CHECK(meeting.late(10.0) == Approx(0.9));  // the last point's beyond it
  fsdp::StepTimeModel m{.compute = {.default_flops_per_second = 1e9, .bytes_per_second = 1e9, .op_seconds = 0},
                        .link = {.latency_seconds = 0, .bytes_per_second = 1e12}};
  m.meetings[2] = meeting;
  // The tp collective after 3 s meets 0.9 s late, the one 0.5 s after it 0.5 s late; the dp
  // collective in between is another group's: it does not shorten the tp group's compute.
  const std::vector<step_trace::Event> trace{op(3e9, 0),      start(1, 8, 2, "tp"), wait(1), op(0.25e9, 0), start(2, 8, 2, "dp"),
                                             wait(2),         op(0.25e9, 0),        start(3, 8, 2, "tp"), wait(3)};
  const std::vector<double> before = fsdp::compute_before_collectives(trace, m.compute);
  CHECK(before[1] == Approx(3.0));
  CHECK(before[4] == Approx(3.25));
  CHECK(before[7] == Approx(0.5));
  CHECK(fsdp::predict_step_time(trace, m).seconds == Approx(3.5 + 0.9 + 0.9 + 0.5).epsilon(1e-6));
}

TEST_CASE("step-time model: without overlap a collective moves only while the step waits for it") {
  fsdp::StepTimeModel m{.compute = {.default_flops_per_second = 1e9, .bytes_per_second = 1e9, .op_seconds = 0},
                        .link = {.latency_seconds = 0, .bytes_per_second = 1e6}};
  const double ring = 0.75 * 2.0;  // 2e6 bytes over 4 ranks
  const std::vector<step_trace::Event> prefetched{start(1, 2e6, 4), op(1e9, 0), wait(1)};
  CHECK(fsdp::predict_step_time(prefetched, m).seconds == Approx(ring));  // hidden under 1 s of compute
  m.overlap = false;
  CHECK(fsdp::predict_step_time(prefetched, m).seconds == Approx(1 + ring));  // after the compute, at its wait
  // Waiting for the second drives the first too, in issue order; the first's wait is then free.
  const auto two = fsdp::predict_step_time({start(1, 2e6, 4), start(2, 2e6, 4), op(1e9, 0), wait(2), op(1e9, 0), wait(1)}, m);
  CHECK(two.seconds == Approx(1 + 2 * ring + 1));
  // Never waited for: it moves after the step's compute.
  CHECK(fsdp::predict_step_time({start(1, 2e6, 4), op(1e9, 0)}, m).seconds == Approx(1 + ring));
  CHECK_THROWS_WITH(fsdp::predict_step_time({wait(9)}, m), Catch::Matchers::Contains("never started"));
}

TEST_CASE("step-time model: a group with a link of its own (tensor parallelism inside a node)") {
  fsdp::StepTimeModel m{.compute = {.default_flops_per_second = 1e9, .bytes_per_second = 1e9, .op_seconds = 0},
                        .link = {.latency_seconds = 0, .bytes_per_second = 1e6}};
  const double slow = 0.75 * 2.0;  // 2e6 bytes over 4 ranks at 1e6 B/s
  const std::vector<step_trace::Event> both{start(1, 2e6, 4), start(2, 2e6, 4, "tp"), wait(1), wait(2)};
  CHECK(fsdp::predict_step_time(both, m).seconds == Approx(2 * slow));  // one link: one after the other
  m.group_links["tp"] = {.latency_seconds = 0, .bytes_per_second = 1e8};
  CHECK(fsdp::predict_step_time({start(2, 2e6, 4, "tp"), wait(2)}, m).seconds == Approx(slow / 100));  // its own rate
  CHECK(fsdp::predict_step_time(both, m).seconds == Approx(slow));  // and its own timeline: beside the other
}
