#include "fsdp/step_time.h"

#include <algorithm>
#include <cmath>
#include <deque>

#include "core/error.h"

namespace weft::fsdp {

double collective_seconds(const std::string& kind, double bytes, int ranks, const Link& link) {
  if (ranks <= 1) return 0;
  const double n = ranks, a = link.latency_seconds, wire = bytes / link.bytes_per_second;
  const double hops = std::ceil(std::log2(n));
  if (kind == "all_gather_into_tensor" || kind == "reduce_scatter_tensor" || kind == "all_to_all_single")
    return (n - 1) * a + (n - 1) / n * wire;
  if (kind == "all_reduce") return std::min(2 * (n - 1) * a + 2 * (n - 1) / n * wire, hops * (a + wire));
  if (kind == "broadcast") return hops * (a + wire);
  if (kind == "barrier") return hops * a;
  WEFT_ERROR("step-time model: no cost for collective \"{}\"", kind);
}

double op_seconds(const step_trace::Event& op, const ComputeRates& rates) {
  if (op.flops > 0) {
    auto it = rates.flops_per_second.find(op.name);
    return op.flops / (it != rates.flops_per_second.end() ? it->second : rates.default_flops_per_second);
  }
  return op.bytes / rates.bytes_per_second;
}

double Meeting::late(double compute) const {
  for (size_t i = 0; i < points.size(); ++i) {
    const auto [x, y] = points[i];
    if (compute > x) continue;
    if (i == 0) return y;
    const auto [x0, y0] = points[i - 1];
    return y0 + (y - y0) * (compute - x0) / (x - x0);
  }
  return points.empty() ? 0 : points.back().second;
}

std::vector<double> compute_before_collectives(const std::vector<step_trace::Event>& trace, const ComputeRates& rates) {
  std::vector<double> before(trace.size(), 0.0);
  std::map<std::string, double> last;  // by group: the compute done when its previous collective started
  double busy = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const step_trace::Event& e = trace[i];
    if (e.kind == step_trace::Event::Kind::op) busy += op_seconds(e, rates) + rates.op_seconds;
    if (e.kind != step_trace::Event::Kind::collective_start) continue;
    before[i] = busy - last[e.group];
    last[e.group] = busy;
  }
  return before;
}

StepTime predict_step_time(const std::vector<step_trace::Event>& trace, const StepTimeModel& model) {
  using Kind = step_trace::Event::Kind;
  StepTime t;
  double now = 0;                         // the compute timeline
  std::map<std::string, double> link_free;  // by link ("": the default one): when it finishes its last collective
  std::map<uint64_t, double> done;  // collective id -> when it completes
  struct Issued { uint64_t id; std::string link; double cost, late; };
  std::deque<Issued> issued;  // not yet on their link (without overlap: until the step waits)
  // Puts the issued collectives on their links in issue order, up to `id` (all: ~0).
  auto move = [&](uint64_t id) {
    while (!issued.empty()) {
      const Issued c = issued.front();
      issued.pop_front();
      double& free = link_free[c.link];
      free = std::max(free, now) + c.cost;
      done[c.id] = free + c.late;  // ranks meeting late delay its end, not the link's next collective
      if (c.id == id) return;
    }
  };
  const std::vector<double> computed = compute_before_collectives(trace, model.compute);
  for (size_t i = 0; i < trace.size(); ++i) {
    const step_trace::Event& e = trace[i];
    if (e.kind == Kind::op) {
      const double s = op_seconds(e, model.compute);
      (e.flops > 0 ? t.flops_ops : t.bytes_ops) += s;
      t.per_op += model.compute.op_seconds;
      now += s + model.compute.op_seconds;
      t.ops += 1;
    } else if (e.kind == Kind::collective_start) {
      // One rank's collective moves nothing over the link but still copies its buffer.
      const auto own = model.group_links.find(e.group);
      const bool apart = own != model.group_links.end();
      const double cost = e.group_size > 1 ? collective_seconds(e.name, e.bytes, e.group_size, apart ? own->second : model.link)
                                           : e.bytes / model.compute.bytes_per_second;
      const auto meet = model.meetings.find(e.group_size);
      const double late = meet == model.meetings.end() ? 0 : meet->second.late(computed[i]);
      issued.push_back({e.id, apart ? e.group : "", cost, late});
      if (model.overlap) move(e.id);
      t.communication += cost + late;
      t.by_collective[e.name] += cost + late;
      t.collectives += 1;
    } else {
      if (!done.count(e.id)) {
        WEFT_CHECK(std::any_of(issued.begin(), issued.end(), [&](const Issued& c) { return c.id == e.id; }),
                   "step-time model: the trace waits for collective {}, which never started", e.id);
        move(e.id);
      }
      now = std::max(now, done.at(e.id));
    }
  }
  move(~uint64_t(0));
  t.compute = t.flops_ops + t.bytes_ops + t.per_op;
  t.seconds = now;  // the step ends when its compute and every collective are done
  for (const auto& [id, end] : done) t.seconds = std::max(t.seconds, end);
  t.exposed = t.seconds - t.compute;
  return t;
}

}  // namespace weft::fsdp
