// dist: the check that every rank of a group is about to run the same collective, made before any buffer is touched. A
// mismatch would otherwise hang, corrupt memory inside MPI (counts that differ overrun the smaller buffers) or silently
// mix up data. Always on for MPI groups: the ranks all-reduce a fingerprint of the call, and only when it differs
// exchange the full descriptions to name the calls. In debug mode (WEFT_DIST_DEBUG) the full descriptions are exchanged
// every time.
#include <array>
#include <cstring>

#include "dist/agree.h"
#include "dist/backend.h"
#include "dist/check.h"
#include "dist/dist.h"

namespace weft::dist::detail {
namespace {

constexpr size_t kLabelBytes = 120;

// One rank's call as the ranks exchange it.
struct Descriptor {
  std::array<int64_t, 8> numbers;  // seq, kind, dtype, in_numel, out_numel, op, root, the whole label's hash
  char label[kLabelBytes];
  bool operator==(const Descriptor& o) const {
    return numbers == o.numbers && std::memcmp(label, o.label, kLabelBytes) == 0;
  }
};

Descriptor describe(const CollectiveInfo& i) {
  Descriptor d{{int64_t(i.seq), int64_t(i.kind), int64_t(i.dtype), i.in_numel, i.out_numel, int64_t(i.op), i.root,
                int64_t(std::hash<std::string>{}(i.label) >> 1)}, {}};  // labels past kLabelBytes differ too
  std::strncpy(d.label, i.label.c_str(), kLabelBytes - 1);
  return d;
}

CollectiveInfo undescribe(const Descriptor& d, const CollectiveInfo& like) {
  CollectiveInfo i = like;
  i.seq = uint64_t(d.numbers[0]);
  i.kind = CollectiveKind(d.numbers[1]);
  i.dtype = DType(d.numbers[2]);
  i.in_numel = d.numbers[3];
  i.out_numel = d.numbers[4];
  i.op = ReduceOp(d.numbers[5]);
  i.root = int(d.numbers[6]);
  i.label = std::string(d.label, strnlen(d.label, kLabelBytes));
  return i;
}

}  // namespace

int64_t fingerprint(const CollectiveInfo& i) {
  // FNV-1a over the description, kept below 2^62 so that its negation is exact.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t k = 0; k < n; ++k) h = (h ^ static_cast<const unsigned char*>(p)[k]) * 1099511628211ull;
  };
  Descriptor d = describe(i);
  mix(d.numbers.data(), sizeof d.numbers);
  mix(d.label, kLabelBytes);
  return int64_t(h >> 2);
}

void compare_calls(MPI_Comm comm, const std::vector<int>& world_ranks, const CollectiveInfo& info) {
  int size = int(world_ranks.size());
  Descriptor mine = describe(info);
  std::vector<Descriptor> all(static_cast<size_t>(size));
  MPI_Request request;
  MPI_CHECK(MPI_Iallgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine), MPI_BYTE, comm, &request));
  wait_request(request, info, "stuck in the check that the ranks issue the same collective");
  // Every rank sees the same table, so every rank reaches the same verdict and throws the
  // same message: no rank is left waiting in a collective the others skipped.
  int first_bad = -1;
  for (int r = 1; r < size && first_bad < 0; ++r)
    if (!(all[size_t(r)] == all[0])) first_bad = r;
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
  throw AgreedError(
      fmt::format("dist collective check{}: the ranks of group '{}' ({} ranks) issue different collectives: {} calls "
                  "{} but {} calls {}. Every rank must issue the same collectives with the same sizes and dtypes "
                  "in the same order. All calls:{}",
                  debug_mode() ? " (WEFT_DIST_DEBUG)" : "", info.group, size, who(0), undescribe(all[0], info).call(),
                  who(first_bad), undescribe(all[size_t(first_bad)], info).call(), calls),
      world_ranks[size_t(first_bad)], size == world_size());
}

}  // namespace weft::dist::detail
