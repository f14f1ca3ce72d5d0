#include "apps/common/stop.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace weft::apps {
namespace {

std::atomic<int> g_signal{0};
// Written before the handlers are installed and only read by them (a handler may only call async-signal-safe functions).
std::string g_at_once, g_again;

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) return;  // the first: the loop stops at the step's end
  // A SIGTERM after it changes nothing (Slurm signals the ranks and mpirun, which signals them again: the step and its
  // checkpoint go on); a SIGINT (Ctrl-C again) stops at once, as its default action would (no checkpoint).
  const std::string& say = sig == SIGTERM ? g_again : g_at_once;
  (void)!write(STDERR_FILENO, say.data(), say.size());  // nothing to do if it fails
  if (sig == SIGTERM) return;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

std::string signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGINT) return "SIGINT";
  return fmt::format("signal {}", sig);
}

StopSignals::StopSignals(const std::string& program) {
  g_at_once = fmt::format("{}: a second stop signal: stopping at once, without a checkpoint\n", program);
  g_again = fmt::format("{}: SIGTERM again: still stopping after this step, with its checkpoint (SIGINT or SIGKILL "
                        "stops at once)\n", program);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // reads and writes in progress go on
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT})
    WEFT_CHECK(sigaction(sig, &sa, nullptr) == 0, "{}: sigaction({}) failed: {} (at {}:{})", program, signal_name(sig),
               std::strerror(errno), __FILE__, __LINE__);
}

StopSignals::~StopSignals() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

int received_stop_signal() { return g_signal.load(); }

StepEnd end_step(double local_loss, const Ranks& ranks, bool agreed) {
  const int sig = received_stop_signal();
  if (!ranks.fsdp) return {local_loss, sig};
  Tensor t = from_vector({local_loss, sig == SIGTERM ? 1.0 : 0.0, sig == SIGINT ? 1.0 : 0.0}, {3}, {.dtype = kFloat64});
  dist::world()->all_reduce(t, dist::ReduceOp::sum)->wait();
  const double* v = t.data<double>();
  // sum / world: what ReduceOp::avg computes, so the logged loss is the same as before.
  return {agreed ? local_loss : v[0] / double(ranks.world), v[1] > 0 ? SIGTERM : v[2] > 0 ? SIGINT : 0};
}

int report_stop(const std::string& program, int sig, int64_t step, const std::string& checkpoint, const Ranks& ranks,
                const std::string& no_checkpoint_reason) {
  std::string who = ranks.world > 1 ? fmt::format("rank {}: ", ranks.rank) : "";
  std::string what = checkpoint.empty() ? no_checkpoint_reason : "checkpoint written to " + checkpoint;
  std::fprintf(stderr, "%s: %sstopping after step %lld on %s; %s\n", program.c_str(), who.c_str(), (long long)step,
               signal_name(sig).c_str(), what.c_str());
  std::fflush(stderr);
  return 128 + sig;
}

}  // namespace weft::apps
