#include "fsdp/checkpoint_dir.h"

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "fsdp/checkpoint.h"
#include "fsdp/checkpoint_index.h"

namespace weft::fsdp {

namespace fs = std::filesystem;

std::string checkpoint_step_dir(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string checkpoint_temp_dir(int64_t step) { return ".tmp-" + checkpoint_step_dir(step); }

namespace {

// The step of a name "<prefix>step_<digits>", or -1 when the name is not of that form.
int64_t step_of(const std::string& name, const std::string& prefix) {
  const std::string head = prefix + "step_";
  if (name.size() <= head.size() || name.size() > head.size() + 18 || name.rfind(head, 0) != 0 ||
      name.find_first_not_of("0123456789", head.size()) != std::string::npos)
    return -1;
  return std::stoll(name.substr(head.size()));
}

// Leftovers of saves that stopped before publishing (".tmp-step_N", ".old-step_N") for steps
// up to the one just published: a training run saves its steps in order, so nothing can still
// be writing them. Later steps' leftovers are kept (another run may own them).
void remove_stale_temporaries(const fs::path& dir, int64_t published) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = std::max(step_of(name, ".tmp-"), step_of(name, ".old-"));
    if (step >= 0 && step <= published) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove_all(p, ec);  // best effort: the checkpoint is already safe
}

}  // namespace

std::map<int64_t, fs::path> complete_checkpoints(const fs::path& dir) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    // step_<digits>, at most 18 of them (so the number fits an int64; longer names are not ours).
    const int64_t step = step_of(name, "");
    if (step >= 0 && fs::exists(e.path() / kCheckpointIndexFile)) out[step] = e.path();
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
  remove_stale_temporaries(final_dir.parent_path(), step_of(final_dir.filename().string(), ""));
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
