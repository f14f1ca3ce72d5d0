// fsdp: the step-time model. Predicts how long one training step takes from the step trace of the memory planner's meta
// step (core/step_trace.h: every op in order with its FLOPs and bytes, every collective where it starts and where the
// step waits for it), a machine's compute rates and a network:
//   - an op takes `op_seconds` (dispatch, autograd, allocation: the framework's share) plus its
//     FLOPs at the rate measured for its shape (GEMMs and attention), or else its operand bytes
//     at the element-wise rate;
//   - a collective of S bytes (the larger buffer) over n ranks costs, on a link of latency a and
//     bandwidth B: all-gather, reduce-scatter and all-to-all (n-1) a + (n-1)/n S/B (a ring);
//     all-reduce the lesser of a ring's 2 (n-1) a + 2 (n-1)/n S/B and recursive doubling's
//     ceil(log2 n) (a + S/B); broadcast ceil(log2 n) (a + S/B); barrier ceil(log2 n) a; over
//     one rank, a copy of S bytes at the element-wise rate (MPI copies the buffer even there);
//     a collective ends later by the time the group's ranks take to meet, which grows with the
//     compute each did since the group's previous collective (`Meeting`: measured under mpirun,
//     where ranks may share cores) and does not hold the link;
//   - as weft schedules them: ops run one after another on the compute timeline; a collective
//     starts when it is issued and the collective before it on its link is done (one link per
//     rank, or one more for groups given their own: `group_links`), and the step waits for it
//     where the trace says (a prefetched all-gather overlaps the compute issued between its
//     start and its wait; a tensor-parallel all-reduce is waited for at once); with no core to
//     spare (`StepTimeModel::overlap` false) it moves only at the step's wait for it, with those
//     issued before it. The step ends when both timelines are done.
// See docs/PARALLEL.md ("Step-time model") for its validation against measured steps.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "../core/step_trace.h"

namespace weft::fsdp {

struct ComputeRates {
  std::map<std::string, double> flops_per_second;  // by op name (the trace's: a GEMM's names its shape)
  double default_flops_per_second = 1e10;          // an op with FLOPs whose name has no measured rate
  double bytes_per_second = 1e10;                  // ops without FLOPs: operand bytes per second
  double op_seconds = 0;                           // added to every op
};

struct Link {
  double latency_seconds = 5e-6;
  double bytes_per_second = 12.5e9;  // one rank's link, each direction (100 Gb/s)
};

// How late the ranks of a group meet at a collective (a rank a time slice behind, slower GEMMs)
// by the compute each did since the group's previous collective: measured points (seconds of
// compute, seconds late), joined by straight lines, the first point's value below it (ranks
// that share cores drift apart as soon as they compute at all) and the last's beyond it.
struct Meeting {
  std::vector<std::pair<double, double>> points;  // by compute, ascending
  double late(double compute) const;
};

struct StepTimeModel {
  ComputeRates compute;
  Link link;  // every collective's, except over groups named in `group_links`
  // Links of their own, by the trace's group name (e.g. "tp": tensor parallelism inside a node):
  // each its own timeline, beside the default link's.
  std::map<std::string, Link> group_links;
  std::map<int, Meeting> meetings;  // by group size (measured under mpirun; none: ranks meet at once)
  // false: a collective moves only while the step waits for it (a host running more ranks than
  // cores: the ranks' communication threads find no free core while they compute), so it goes
  // on its link at its wait, after every collective issued before it.
  bool overlap = true;
};

struct StepTime {
  double seconds = 0;        // the step
  double compute = 0;        // the compute timeline's busy time
  double flops_ops = 0;      // of it: ops with FLOPs (GEMMs, attention) at their rates
  double bytes_ops = 0;      // ops without FLOPs at the element-wise rate
  double per_op = 0;         // op_seconds times the ops
  double communication = 0;  // every collective's cost
  double exposed = 0;        // seconds - compute: communication the compute did not hide
  int64_t ops = 0, collectives = 0;
  std::map<std::string, double> by_collective;  // cost by collective kind
};

double collective_seconds(const std::string& kind, double bytes, int ranks, const Link& link);
double op_seconds(const step_trace::Event& op, const ComputeRates& rates);
// For each event of the trace: a collective's compute since its group's previous collective
// started (since the step began, for the group's first), at `rates`; 0 for other events.
std::vector<double> compute_before_collectives(const std::vector<step_trace::Event>& trace, const ComputeRates& rates);
StepTime predict_step_time(const std::vector<step_trace::Event>& trace, const StepTimeModel& model);

}  // namespace weft::fsdp
