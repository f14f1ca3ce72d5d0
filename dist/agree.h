// dist: keeping ranks in step when one of them fails. Work that may fail on some ranks only (reading a file, checking
// flags, writing a checkpoint) runs inside agree(); afterwards every rank learns whether any rank failed, and if one
// did, every rank throws. No rank goes on alone to a collective that a failed rank never joins (it would wait there
// until the collective timeout aborts the job).
//
//   dist::agree({dist::world()}, "loading the data", [&] { data = load(path); });
//
// A program's main hands its body to run_program, which ends the process cleanly after an
// agreed failure and aborts the whole job after any other one (see docs/DIST.md).
#pragma once
#include <exception>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.h"
#include "process_group.h"

namespace weft::dist {

// A failure every rank of an agreement knows about. The rank that failed keeps its own message;
// the others say "<what> failed on another rank (rank K: <rank K's message>)".
struct AgreedError : Error {
  AgreedError(const std::string& message, int failed_rank, bool everywhere = false)
      : Error(message), failed_rank(failed_rank), everywhere(everywhere) {}
  int failed_rank;  // the lowest world rank that failed
  // Every rank of the world throws it (an exchange over the world found it): agree_on_error passes it on with no
  // collective, as the others may already be past theirs (a mismatch the collective check found in their agreement).
  bool everywhere;
};

// Every rank of `groups` calls it with its own outcome (null: no error). `groups` together span the ranks taking part:
// one group, or a DeviceMesh's groups (each is reduced over in turn). Null groups and groups of one are skipped, so a
// process alone needs no dist::init(). Returns when no rank failed; otherwise throws AgreedError on every rank: a
// failed rank its own message (an AgreedError passes through unchanged), the others naming the lowest failed rank and
// its message. One all-reduce per group when all went well, two when a rank failed; none for an AgreedError everywhere.
void agree_on_error(std::exception_ptr error, std::string_view what, const std::vector<ProcessGroupPtr>& groups);

// Runs `work` on this rank, then agree_on_error on its outcome.
template <class Work>
void agree(const std::vector<ProcessGroupPtr>& groups, std::string_view what, Work&& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_error(error, what, groups);
}

// The body of a program's main, on every rank: returns body()'s status. An AgreedError (every rank has one) is printed
// as "<program>: error on rank R: ..." ("<program>: error: ..." in a world of one) and gives status 1: all ranks stop
// cleanly. Any other exception, which the other ranks may not share (they may be waiting in a collective), ends the
// whole job through abort_job when there are other ranks. Afterwards dist is finalized if it was started.
int run_program(std::string_view program, const std::function<int()>& body);

}  // namespace weft::dist
