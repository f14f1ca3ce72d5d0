// dist: every rank must run with the same configuration. A launch that hands the ranks different flags (an MPMD `mpirun
// -np 1 app --lr 0.1 : -np 1 app --lr 0.2`, or argv built from each rank's environment) would otherwise train on with
// different models, or hang or corrupt memory in mismatched collectives. A program passes the settings that change the
// math, the data or the collective sequence, as (flag, value as text) in the same order on every rank:
//
//   dist::check_same_config({{"--lr", fmt::format("{}", o.lr)}, {"--steps", ...}}, "weft-mnist");
//
// and every rank throws the same error when any of them differs.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "process_group.h"

namespace weft::dist {

using ConfigSettings = std::vector<std::pair<std::string, std::string>>;

// Compares `settings` over the ranks of `group` (null: the world, when dist is initialized) with two small all-reduces
// (the number of entries, then a 64-bit hash per entry; one gather more when they differ). Returns when every rank
// passed the same names and values. Otherwise throws AgreedError on every rank with the same message, naming the first
// differing flag and each rank's value (cut to 60 characters):
//   "<program>: the ranks differ: --lr is 0.1 on rank 0, 0.2 on rank 1
//    (every rank must get the same flags)"
// (ranks with equal values are listed together, "on ranks 0-1,3"). Ranks are group ranks, and failed_rank is the world
// rank of the lowest group rank whose value differs from rank 0's. A group of one (or no dist at all) is a no-op.
// `rule` replaces the parenthesis for settings that are not flags (the contents of the files read, say).
void check_same_config(const ConfigSettings& settings, std::string_view program, ProcessGroupPtr group = nullptr,
                       std::string_view rule = "every rank must get the same flags");

}  // namespace weft::dist
