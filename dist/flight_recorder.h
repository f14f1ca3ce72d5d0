// dist: the flight recorder. Every rank keeps its last collectives (WEFT_FLIGHT_RECORDER entries, default 256):
// sequence number, kind, group, dtype, sizes, the label of the code that issued it (e.g. the FSDP module and phase) and
// how far it got. When a collective times out, the rank asks the other ranks of its group how far they got (over a
// private duplicate of the world communicator, answered by their communication threads), names the ranks that never
// issued the collective, and every rank that hears of the timeout writes its record to stderr and, if WEFT_FLIGHT_DIR
// is set, to WEFT_FLIGHT_DIR/flight_rank<R>.txt. See docs/DIST.md.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "process_group.h"

namespace weft::dist {

// How far a recorded collective got.
enum class CollectiveStage : uint8_t {
  issued,     // handed to the backend
  checking,   // its fingerprint is being compared across the group
  posted,     // running in MPI or NCCL
  completed,
  failed,
};
std::string_view collective_stage_name(CollectiveStage stage);

// This rank's record, oldest first, one collective per line.
std::string flight_record();

namespace detail {

void flight_issued(const CollectiveInfo& info, const std::vector<int>& world_ranks);
// `at`: when the stage began (now if not given).
void flight_stage(const CollectiveInfo& info, CollectiveStage stage,
                  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now());

// The status exchange: started by dist::init() (after MPI), stopped by finalize().
void flight_start();
void flight_stop();
// Answers the status requests of ranks that timed out (and writes this rank's record once).
// Called by the communication thread now and then; cheap when there is nothing to answer.
void flight_serve();
// For a collective that timed out: asks the other ranks of its group how far they got, for at
// most `grace_seconds`, writes this rank's record, and returns a report naming the ranks that
// have not issued the collective and those that did not answer.
std::string flight_timeout_report(const CollectiveInfo& info, double grace_seconds);

}  // namespace detail
}  // namespace weft::dist
