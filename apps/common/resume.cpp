#include "apps/common/resume.h"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "apps/common/output_paths.h"
#include "core/error.h"
#include "fsdp/checkpoint.h"

namespace weft::apps {

void check_resumed_setting(const std::map<std::string, std::string>& app, const std::string& key,
                           const std::string& flag, const std::string& value, const std::string& why,
                           const std::string& where, const std::string& program) {
  auto it = app.find(key);
  if (it == app.end()) return;
  WEFT_CHECK(it->second == value, "{}: {} was written with {} {} but {} is {}: {}; pass {} {} to resume it (or start a "
             "new run)", program, where, flag, it->second, flag, value, why, flag, it->second);
}

void check_resumed_determinism(const std::map<std::string, std::string>& app, int64_t virtual_batches,
                               const std::string& where, const std::string& program) {
  auto flags = [](const std::string& n) { return n == "0" ? "no --deterministic" : "--deterministic --virtual-batches " + n; };
  auto it = app.find("virtual_batches");
  WEFT_CHECK(it == app.end() || it->second == std::to_string(virtual_batches), "{}: {} was written with {}, and this "
             "run has {}: the summation order decides the bits of every later step; resume it with {} (or start a new "
             "run)", program, where, flags(it->second), flags(std::to_string(virtual_batches)), flags(it->second));
}

void check_resumed_data(const std::map<std::string, std::string>& app, const std::map<std::string, std::string>& now,
                        const std::string& what, const std::string& source, const std::string& where,
                        const std::string& program) {
  std::string recorded, given;
  bool differ = false;
  for (auto& [key, value] : now) {
    auto it = app.find(key);
    if (it == app.end()) continue;
    recorded += fmt::format("{}{} {}", recorded.empty() ? "" : ", ", key, it->second);
    given += fmt::format("{}{} {}", given.empty() ? "" : ", ", key, value);
    differ |= it->second != value;
  }
  WEFT_CHECK(!differ, "{}: {} was written with a {} of {} but {} gives {}: the data position counts into that {}, so "
             "resuming on other data would not continue the run; give the same data (or start a new run)", program,
             where, what, recorded, source, given, what);
}

int64_t data_position(const std::map<std::string, int64_t>& data, const std::string& key, int64_t lo, int64_t hi,
                      const std::string& where, const std::string& program) {
  auto it = data.find(key);
  WEFT_CHECK(it != data.end(), "{}: {} records no data position \"{}\"", program, where, key);
  WEFT_CHECK(it->second >= lo && it->second <= hi, "{}: {}: data position \"{}\" is {}, outside [{}, {}] for these "
             "flags: the checkpoint is damaged or was written with other data", program, where, key, it->second, lo, hi);
  return it->second;
}

std::string readable_checkpoint(const std::string& path, const std::string& program, bool say, bool fall_back) {
  std::vector<std::string> unreadable;
  const std::string where = fsdp::latest_checkpoint(path, &unreadable);
  WEFT_CHECK(!where.empty() || unreadable.empty(), "{}", unreadable.front());  // none reads: the newest's error
  WEFT_CHECK(fall_back || unreadable.empty(), "{}: a newer checkpoint in {} cannot be read ({}); the newest that reads "
             "is {}: name it to use it", program, path, unreadable.front(), where);
  for (const std::string& why : unreadable)
    if (say) fmt::print(stderr, "weft-{}: passing over a checkpoint that cannot be read: {}\n", program, why);
  if (say && !unreadable.empty())
    fmt::print(stderr, "weft-{}: using {}, the newest checkpoint in {} that reads\n", program, where, path);
  return where;
}

void check_checkpoint_dir(const std::string& dir, const std::string& flag, const std::string& program) {
  if (!dir.empty()) check_output_place({flag, dir, true}, program);
}

}  // namespace weft::apps
