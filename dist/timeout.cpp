// dist: what happens when a collective does not finish in time. The ranks of a job can no
// longer agree on what comes next, so the job is ended (MPI_Abort) rather than left hanging.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "dist/backend.h"
#include "dist/check.h"
#include "dist/dist.h"
#include "dist/flight_recorder.h"

namespace weft::dist::detail {

// mpirun passes this on as the job's exit status, so scripts can tell a timeout apart.
constexpr int kTimeoutExitCode = 124;

void fail_timeout(const CollectiveInfo& info, double seconds, const std::string& state) {
  // The waiting thread and the communication thread may both see the timeout: one reports.
  static std::atomic<bool> reporting{false};
  if (reporting.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  // Ask the group how far each rank got; a live rank answers within milliseconds.
  std::string report = flight_timeout_report(info, std::clamp(seconds, 1.0, 5.0));
  abort_job(fmt::format("{} did not complete within {:g} s ({}). A rank of the group may have skipped "
                        "this collective, issued a different one, or died. Aborting the job (the timeout "
                        "comes from WEFT_COLLECTIVE_TIMEOUT or dist::set_collective_timeout). {}",
                        info.str(), seconds, state, report),
            kTimeoutExitCode);
}

void wait_request(MPI_Request& request, const CollectiveInfo& info, const char* stage) {
  using Clock = std::chrono::steady_clock;
  double timeout = collective_timeout();
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout);
  for (int spins = 0;; ++spins) {
    int done = 0;
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (Clock::now() > deadline) fail_timeout(info, timeout, stage);
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace weft::dist::detail
