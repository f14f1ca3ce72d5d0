// apps: where an app's process sits among the ranks, and the two helpers the apps use to
// keep ranks in step: agreeing on failures (so one rank's error stops all of them instead of
// leaving the others waiting in the next collective) and averaging a scalar over ranks.
#pragma once
#include <exception>

#include "core/error.h"
#include "dist/dist.h"

namespace weft::apps {

// Without --fsdp: a world of one that never communicates.
struct Ranks {
  bool fsdp = false;
  int rank = 0, world = 1;
  bool lead() const { return rank == 0; }  // prints, writes metrics and checkpoints
};

// A failure every rank knows about: all of them stop cleanly (no rank is left waiting).
struct AgreedError : Error {
  using Error::Error;
};

// Runs rank-local work (reading files, checking flags), then lets every rank learn whether any
// rank failed. The failing rank reports its own message; the others say (naming `app`) why
// they stop. Either way every rank throws AgreedError.
void agree_on_failure(const Ranks& ranks, const char* app, std::exception_ptr error);
template <class Work>
void on_every_rank(const Ranks& ranks, const char* app, Work&& work) {
  std::exception_ptr error;
  try {
    work();
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_failure(ranks, app, error);
}

double mean_over_ranks(double local, const Ranks& ranks);

}  // namespace weft::apps
