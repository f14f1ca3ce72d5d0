// dist: debug mode's check that every rank of a group is about to run the same collective.
// A mismatch would otherwise hang, crash inside MPI or NCCL, or silently mix up data.
#include <array>

#include "dist/backend.h"
#include "dist/check.h"

namespace weft::dist::detail {
namespace {

using Descriptor = std::array<int64_t, 7>;

Descriptor describe(const CollectiveInfo& i) {
  return {int64_t(i.seq), int64_t(i.kind), int64_t(i.dtype), i.in_numel, i.out_numel, int64_t(i.op), i.root};
}

CollectiveInfo undescribe(const Descriptor& d, const CollectiveInfo& like) {
  CollectiveInfo i = like;
  i.seq = uint64_t(d[0]);
  i.kind = CollectiveKind(d[1]);
  i.dtype = DType(d[2]);
  i.in_numel = d[3];
  i.out_numel = d[4];
  i.op = ReduceOp(d[5]);
  i.root = int(d[6]);
  return i;
}

}  // namespace

void debug_check(MPI_Comm comm, const std::vector<int>& world_ranks, const CollectiveInfo& info) {
  int size = int(world_ranks.size());
  Descriptor mine = describe(info);
  std::vector<Descriptor> all(static_cast<size_t>(size));
  MPI_Request request;
  MPI_CHECK(MPI_Iallgather(mine.data(), 7, MPI_INT64_T, all.data(), 7, MPI_INT64_T, comm, &request));
  wait_request(request, info, "stuck in the debug-mode check before it");
  // Every rank sees the same table, so every rank reaches the same verdict and throws the
  // same message: no rank is left waiting in a collective the others skipped.
  int first_bad = -1;
  for (int r = 1; r < size && first_bad < 0; ++r)
    if (all[size_t(r)] != all[0]) first_bad = r;
  if (first_bad < 0) return;
  auto who = [&](int r) {
    return world_ranks[size_t(r)] == r ? fmt::format("rank {}", r)
                                       : fmt::format("rank {} (world rank {})", r, world_ranks[size_t(r)]);
  };
  std::string calls;
  for (int r = 0; r < size; ++r) {
    if (size > 16 && all[size_t(r)] == all[0] && r != 0) continue;  // list only the odd ones out
    calls += fmt::format("\n  {}: {}", who(r), undescribe(all[size_t(r)], info).call());
  }
  WEFT_ERROR("dist debug check (WEFT_DIST_DEBUG): the ranks of group '{}' ({} ranks) issue different "
             "collectives: {} calls {} but {} calls {}. Every rank must issue the same collectives with "
             "the same sizes and dtypes in the same order. All calls:{}",
             info.group, size, who(0), undescribe(all[0], info).call(), who(first_bad),
             undescribe(all[size_t(first_bad)], info).call(), calls);
}

}  // namespace weft::dist::detail
