#include "fsdp/checkpoint_dir.h"

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_index.h"

namespace weft::fsdp {

namespace fs = std::filesystem;

std::string checkpoint_step_dir(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string checkpoint_temp_dir(int64_t step) { return ".tmp-" + checkpoint_step_dir(step); }

std::map<int64_t, fs::path> complete_checkpoints(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    // step_<digits>, at most 18 of them (so the number fits an int64; longer names are not ours).
    if (name.size() <= 5 || name.size() > 5 + 18 || name.rfind("step_", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !fs::exists(e.path() / kCheckpointIndexFile))
      continue;
    out[std::stoll(name.substr(5))] = e.path();
  }
  return out;
}

void publish_checkpoint(const fs::path& tmp, const fs::path& final_dir, int keep_last) {
  fsync_directory(tmp.string());
  fs::path old = final_dir.parent_path() / (".old-" + final_dir.filename().string());
  if (fs::exists(final_dir)) {
    fs::remove_all(old);
    fs::rename(final_dir, old);
  }
  fs::rename(tmp, final_dir);
  fsync_directory(final_dir.parent_path().string());
  fs::remove_all(old);
  if (keep_last <= 0) return;
  auto all = complete_checkpoints(final_dir.parent_path());
  int excess = int(all.size()) - keep_last;
  for (auto& [step, path] : all) {
    if (excess-- <= 0) break;
    if (path != final_dir) fs::remove_all(path);
  }
}

std::string latest_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / kCheckpointIndexFile)) return path;
  auto all = complete_checkpoints(path);
  return all.empty() ? std::string() : all.rbegin()->second.string();
}

}  // namespace weft::fsdp
