// apps: stopping cleanly on SIGTERM (what Slurm and mpirun send before killing a job) and SIGINT (Ctrl-C). The handler
// only records the signal; the training loop finishes its step, the ranks agree on the step to stop after (the stop
// flags ride in the all-reduce of the step's loss, so it costs no extra collective), a checkpoint is written, and the
// program exits 128 + signal (143 for SIGTERM, 130 for SIGINT). A SIGINT after the first signal ends the process at
// once, as the default action would; a SIGTERM after it changes nothing (a launcher passes on the one its job got as
// well). See docs/CHECKPOINTS.md, "Stopping".
#pragma once
#include <string>

#include "apps/common/ranks.h"

namespace weft::apps {

// While it lives, SIGTERM and SIGINT are recorded (the training loop's scope: after dist::init,
// which may install MPI's own handlers); afterwards their default actions are back. `program`
// names the process in the message a second signal prints.
class StopSignals {
 public:
  explicit StopSignals(const std::string& program);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The first signal this process received (0: none).
int received_stop_signal();

// "SIGTERM", "SIGINT".
std::string signal_name(int sig);

// The end of a step on every rank: the global batch's mean loss and the signal the ranks stop on
// (0: go on; SIGTERM when any rank received SIGTERM, else SIGINT when any received SIGINT). Under
// --fsdp one all-reduce of {loss, SIGTERM count, SIGINT count}: every rank gets the same answer,
// so all stop after the same step even when the signal reached them at different times.
struct StepEnd {
  double loss;
  int stop_signal;
};
// `agreed`: the loss is already the same on every rank (--deterministic's ordered mean) and comes back as it is.
StepEnd end_step(double local_loss, const Ranks& ranks, bool agreed = false);

// Prints "<program>: [rank R: ]stopping after step N on SIGTERM; checkpoint written to DIR" (or
// why none was) on every rank and returns the exit status, 128 + sig.
int report_stop(const std::string& program, int sig, int64_t step, const std::string& checkpoint, const Ranks& ranks,
                const std::string& no_checkpoint_reason);

}  // namespace weft::apps
