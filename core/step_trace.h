// core: the step trace: the ordered record of what one training step computes and communicates, for the step-time model
// (fsdp/step_time.h). While it records (start() to stop(), on the calling thread), every kernel entry point and element
// copy appends an op event with the floating-point operations and operand bytes the op profiler counts
// (core/op_profiler.h; a GEMM's name carries its shape), and a group that records (dist/fake_group.h) appends the start
// of each collective and the point where the step waits for it. It is meant for the meta device: the memory planner's
// step runs the real code without computing, so the trace is the step as weft schedules it (prefetched all-gathers
// start before the compute they overlap), at any world size, in one process.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace weft::step_trace {

struct Event {
  enum class Kind : uint8_t { op, collective_start, collective_wait };
  Kind kind = Kind::op;
  std::string name;  // op: the op profiler's row name; collective: its kind (dist::collective_name)
  double flops = 0;  // op: as the op profiler counts them (GEMMs and attention; 0 for the rest)
  double bytes = 0;  // op: operand bytes; collective: the larger buffer (all-gather out, reduce-scatter in)
  uint64_t id = 0;   // collective: matches a start with its wait
  int group_size = 1;
  std::string group;  // collective: the group's name
};

void start();              // records this thread's step from now on (clears an earlier record)
std::vector<Event> stop();  // ends the record and returns it
bool recording();          // on this thread

// Leaves what runs while it lives out of the record (e.g. an evaluation batch the memory plan
// counts but a training step's time does not).
class Pause {
 public:
  Pause();
  ~Pause();
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;

 private:
  bool was_;
};

void op(std::string_view name, double flops, double bytes);
// Returns the id its wait passes.
uint64_t collective_start(std::string_view kind, double bytes, int group_size, std::string_view group);
void collective_wait(uint64_t id);

}  // namespace weft::step_trace
