#include "dist/config_check.h"

#include <algorithm>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "core/tensor.h"
#include "dist/agree.h"
#include "dist/dist.h"

namespace weft::dist {
namespace {

constexpr size_t kNameBytes = 48, kValueBytes = 80;  // one setting as gathered: name, value
constexpr size_t kValueChars = 60;                   // longer values are cut, with "..."

// FNV-1a over name, a separator and value, kept to 63 bits so that negating it cannot overflow.
int64_t hash_of(const std::string& name, const std::string& value) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](unsigned char c) { h = (h ^ c) * 1099511628211ull; };
  for (char c : name) mix(static_cast<unsigned char>(c));
  mix(0);
  for (char c : value) mix(static_cast<unsigned char>(c));
  return static_cast<int64_t>(h >> 1);
}

// Per entry of `v`: its minimum and maximum over the group, from one all-reduce (min of v and -v).
std::pair<std::vector<int64_t>, std::vector<int64_t>> min_max(const ProcessGroupPtr& group,
                                                              const std::vector<int64_t>& v) {
  const int64_t n = int64_t(v.size());
  Tensor t = zeros({2 * n}, {.dtype = kInt64});
  for (int64_t i = 0; i < n; ++i) {
    t.data<int64_t>()[i] = v[i];
    t.data<int64_t>()[n + i] = -v[i];
  }
  Tensor on = t.to(group->device());  // NCCL groups take tensors on their GPU only
  group->all_reduce(on, ReduceOp::min)->wait();
  t = on.to(kCPU);
  std::vector<int64_t> lo(n), hi(n);
  for (int64_t i = 0; i < n; ++i) {
    lo[i] = t.data<int64_t>()[i];
    hi[i] = -t.data<int64_t>()[n + i];
  }
  return {lo, hi};
}

std::string shown(std::string value) {
  if (value.empty()) return "(empty)";
  if (value.size() > kValueChars) value = value.substr(0, kValueChars) + "...";
  return value;
}

// "rank 2" or "ranks 0-1,3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ",";
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace

void check_same_config(const ConfigSettings& settings, std::string_view program, ProcessGroupPtr group,
                       std::string_view rule) {
  if (!group) {
    if (!is_initialized()) return;
    group = world();
  }
  if (group->size() <= 1) return;
  const std::string tail = fmt::format(" ({})", rule);
  const std::string head = fmt::format("{}: the ranks differ: ", program);

  // The number of entries first: the hashes below need the same length on every rank.
  auto [count_lo, count_hi] = min_max(group, {int64_t(settings.size())});
  if (count_lo[0] != count_hi[0])
    throw AgreedError(fmt::format("{}the ranks passed between {} and {} settings to compare{}", head, count_lo[0],
                                  count_hi[0], tail),
                      group->world_ranks().at(0), group->size() == world_size());

  std::vector<int64_t> hashes;
  for (auto& [name, value] : settings) hashes.push_back(hash_of(name, value));
  auto [lo, hi] = min_max(group, hashes);
  size_t first = 0;
  while (first < settings.size() && lo[first] == hi[first]) ++first;
  if (first == settings.size()) return;

  // Every rank's name and value of the first differing entry, as bytes in i64 words.
  constexpr size_t kBytes = kNameBytes + kValueBytes;
  Tensor mine = zeros({int64_t(kBytes / 8)}, {.dtype = kInt64});
  char* p = reinterpret_cast<char*>(mine.data<int64_t>());
  const auto& [name, value] = settings[first];
  std::memcpy(p, name.data(), std::min(name.size(), kNameBytes - 1));
  std::string cut = value.size() > kValueChars ? value.substr(0, kValueChars + 1) : value;  // +1: marks a cut
  std::memcpy(p + kNameBytes, cut.data(), std::min(cut.size(), kValueBytes - 1));
  Tensor all = zeros({int64_t(group->size() * kBytes / 8)}, {.dtype = kInt64});
  Tensor in = mine.to(group->device()), out = all.to(group->device());
  group->all_gather_into_tensor(out, in)->wait();
  all = out.to(kCPU);
  const char* bytes = reinterpret_cast<const char*>(all.data<int64_t>());

  // Ranks grouped by (name, value), in the order of their lowest rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // "name\0value" -> ranks
  for (int r = 0; r < group->size(); ++r) {
    const char* at = bytes + r * kBytes;
    std::string key = std::string(at, strnlen(at, kNameBytes)) + '\0' +
                      std::string(at + kNameBytes, strnlen(at + kNameBytes, kValueBytes));
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == key; });
    if (it == groups.end()) groups.push_back({key, {r}});
    else it->second.push_back(r);
  }
  auto name_of = [](const std::string& key) { return key.substr(0, key.find('\0')); };
  auto value_of = [](const std::string& key) { return shown(key.substr(key.find('\0') + 1)); };
  const std::string flag = name_of(groups.front().first);
  std::string listed;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i == 8) {
      listed += fmt::format(", and {} more values", groups.size() - i);
      break;
    }
    if (i > 0) listed += ", ";
    // Names differ only when the program passed its settings in different orders.
    if (name_of(groups[i].first) != flag) listed += name_of(groups[i].first) + " ";
    listed += fmt::format("{} on {}", value_of(groups[i].first), rank_list(groups[i].second));
  }
  const int differing = groups.size() > 1 ? groups[1].second.front() : 0;
  throw AgreedError(fmt::format("{}{} is {}{}", head, flag, listed, tail), group->world_ranks().at(differing),
                    group->size() == world_size());
}

}  // namespace weft::dist
