// apps: where an app's process sits among the ranks. Keeping ranks in step when one fails is
// dist's (dist/agree.h): an app runs rank-local work through dist::agree(ranks.groups(), ...).
#pragma once
#include <vector>

#include "dist/agree.h"
#include "dist/dist.h"

namespace weft::apps {

// Without --fsdp: a world of one that never communicates.
struct Ranks {
  bool fsdp = false;
  int rank = 0, world = 1;
  bool lead() const { return rank == 0; }  // prints, writes metrics and checkpoints
  // The groups an agreement spans: the world under --fsdp, none (this process alone) otherwise.
  std::vector<dist::ProcessGroupPtr> groups() const;
};

double mean_over_ranks(double local, const Ranks& ranks);

}  // namespace weft::apps
