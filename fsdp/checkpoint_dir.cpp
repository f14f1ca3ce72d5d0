#include "fsdp/checkpoint_dir.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <limits>
#include <optional>
#include <set>
#include <sys/file.h>
#include <unistd.h>

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

// Leftovers of saves that stopped before publishing (".tmp-step_N", ".old-step_N") and of removals (".gone-step_N")
// for steps up to `up_to`: a training run saves its steps in order, so nothing can still be writing them. Later steps'
// leftovers are kept (another run may own them) unless the caller holds the lock. A complete .old-step_N without its
// step_N is a replace cut short between its two renames (on a filesystem without RENAME_EXCHANGE): it is the published
// checkpoint, and goes back.
void remove_stale_temporaries(const fs::path& dir, int64_t up_to) {
  std::error_code ec;
  std::vector<fs::path> stale, restore;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = std::max({step_of(name, ".tmp-"), step_of(name, ".old-"), step_of(name, ".gone-")});
    if (step_of(name, ".old-") >= 0 && fs::exists(e.path() / kCheckpointIndexFile, ec) &&
        !fs::exists(dir / name.substr(5), ec))
      restore.push_back(e.path());
    else if (step >= 0 && step <= up_to) stale.push_back(e.path());
  }
  for (const fs::path& p : restore) WEFT_FS(fs::rename(p, dir / p.filename().string().substr(5)));
  for (const fs::path& p : stale) fs::remove_all(p, ec);  // best effort: the checkpoint is already safe
}

// What a complete checkpoint's index records for rotation; `run` is empty when the index
// cannot be read (such a checkpoint belongs to no run and records no loss).
struct Recorded {
  fs::path path;
  std::optional<std::string> run;
  std::optional<double> loss;
};

std::map<int64_t, Recorded> recorded_checkpoints(const fs::path& dir) {
  std::map<int64_t, Recorded> out;
  for (auto& [step, path] : complete_checkpoints(dir)) {
    Recorded r{path, {}, {}};
    try {
      const CheckpointProgress p = read_checkpoint_index(path.string()).training;
      r = Recorded{path, p.run, p.loss};
    } catch (const Error&) {
    }
    out[step] = r;
  }
  return out;
}

// Of `own`'s checkpoints, the one with the lowest finite recorded loss (the newest of equals) and the one before it: a
// loss is logged before its step's update, so the weights that gave it are the earlier checkpoint's (or, with saves
// more than a step apart, the nearest saved). None when none records a loss.
std::set<fs::path> best_checkpoints(const std::map<int64_t, Recorded>& own) {
  auto best = own.end(), before = own.end();
  for (auto it = own.begin(), prev = own.end(); it != own.end(); prev = it++) {
    const std::optional<double>& loss = it->second.loss;
    if (loss && std::isfinite(*loss) && (best == own.end() || *loss <= *best->second.loss)) best = it, before = prev;
  }
  std::set<fs::path> out;
  for (auto it : {best, before})
    if (it != own.end()) out.insert(it->second.path);
  return out;
}

// Removes a published checkpoint: renamed to .gone-step_N first (a removal cut short leaves a leftover the next save
// clears, never a step_N without its index, and never put back as a replace's .old-step_N is), then its index.
// A step_N that is a symbolic link goes as a link: what it points to is not this directory's to remove. The new
// checkpoint is published by now, so a removal that fails (a read-only or immutable old step) is a warning.
void discard(const fs::path& checkpoint) {
  try {
    const fs::path old = checkpoint.parent_path() / (".gone-" + checkpoint.filename().string());
    WEFT_FS(fs::rename(checkpoint, old));
    if (!WEFT_FS(fs::is_symlink(old))) WEFT_FS(fs::remove(old / kCheckpointIndexFile));
    WEFT_FS(fs::remove_all(old));  // a link itself, not its target
  } catch (const Error& e) {
    std::fprintf(stderr, "checkpoint: warning: the older checkpoint %s was not removed (keep_last, replace_other_runs) "
                 "and stays: %s\n", checkpoint.c_str(), e.what());
  }
}

// replace_other_runs (the other runs' checkpoints and this run's past `final_dir`'s step: those of steps a resumed
// run left), then keep_last over run `run`'s checkpoints (SaveOptions).
void rotate(const fs::path& final_dir, const SaveOptions& options, const std::string& run) {
  if (options.keep_last <= 0 && !options.replace_other_runs) return;  // nothing to rotate: no index read
  std::map<int64_t, Recorded> own, others;
  const int64_t step = step_of(final_dir.filename().string(), "");
  for (auto& [s, r] : recorded_checkpoints(final_dir.parent_path()))
    (r.run == run && !(options.replace_other_runs && s > step) ? own : others)[s] = r;
  if (options.replace_other_runs)
    for (auto& [s, r] : others) discard(r.path);
  std::error_code ec;
  const std::set<fs::path> best = best_checkpoints(own);
  int excess = options.keep_last > 0 ? int(own.size()) - options.keep_last : 0;
  for (auto it = own.begin(); excess-- > 0; ++it)
    if (it->second.path != final_dir && !best.count(it->second.path) &&
        !(!options.keep_also.empty() && fs::equivalent(it->second.path, options.keep_also, ec)))
      discard(it->second.path);
}

}  // namespace

std::map<int64_t, fs::path> complete_checkpoints(const fs::path& dir, std::map<int64_t, fs::path>* incomplete) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    // step_<digits>, at most 18 of them (so the number fits an int64; longer names are not ours).
    const int64_t step = step_of(name, "");
    // An index that cannot be looked at (a loop of links) counts: reading it names the problem.
    if (std::error_code seen; step >= 0 && (fs::exists(e.path() / kCheckpointIndexFile, seen) || seen)) out[step] = e.path();
    else if (step >= 0 && incomplete && fs::is_directory(e.path(), seen)) (*incomplete)[step] = e.path();
  }
  return out;
}

void publish_checkpoint(const fs::path& tmp, const fs::path& final_dir, const SaveOptions& options,
                        const std::string& run) {
  fsync_directory(tmp.string());
  fs::path old = final_dir.parent_path() / (".old-" + final_dir.filename().string());
  // Replacing a checkpoint of the same step swaps the two in one step where the filesystem can; else the published one
  // steps aside as .old-step_N first (remove_stale_temporaries puts it back if a crash falls between the renames).
  if (!WEFT_FS(fs::exists(final_dir))) WEFT_FS(fs::rename(tmp, final_dir));
  else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) old = tmp;
  else {
    WEFT_FS(fs::remove_all(old));
    WEFT_FS(fs::rename(final_dir, old));
    WEFT_FS(fs::rename(tmp, final_dir));
  }
  fsync_directory(final_dir.parent_path().string());
  WEFT_FS(fs::remove_all(old));
  remove_stale_temporaries(final_dir.parent_path(), step_of(final_dir.filename().string(), ""));
  rotate(final_dir, options, run);
}

std::map<int64_t, CheckpointOfRun> checkpoint_runs(const std::string& dir) {
  std::map<int64_t, CheckpointOfRun> out;
  for (auto& [step, r] : recorded_checkpoints(dir))
    if (r.run) out[step] = {r.path.string(), *r.run};
  return out;
}

std::vector<std::string> older_kept_checkpoints(const std::string& dir, int keep_last) {
  std::vector<std::string> out;
  if (keep_last <= 0) return out;
  auto all = complete_checkpoints(dir);
  for (auto& [step, path] : all)
    if (int(out.size()) < int(all.size()) - keep_last) out.push_back(path.string());
  return out;
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  WEFT_FS(fs::create_directories(dir));
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  WEFT_CHECK(fd_ >= 0, "checkpoint: cannot open the lock file {}: {}", path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[512] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    WEFT_CHECK(err != EWOULDBLOCK, "checkpoint: {} is in use by another run ({}): two runs writing one checkpoint "
               "directory would rotate away each other's checkpoints; give this run its own directory, or stop the "
               "other", dir, n > 0 ? std::string(buf, size_t(n)) : std::string("holder unknown"));
    WEFT_ERROR("checkpoint: cannot lock {}: {}", path, std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string who = fmt::format("host {}, pid {}, since {:%Y-%m-%d %H:%M:%S} UTC", host, ::getpid(),
                                      fmt::gmtime(std::time(nullptr)));
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, who.data(), who.size(), 0) != ssize_t(who.size())) {
    const int err = errno;
    ::close(fd_);
    WEFT_ERROR("checkpoint: cannot write the lock file {}: {}", path, std::strerror(err));
  }
  // Every leftover is stale now: only the holder of the lock saves here.
  remove_stale_temporaries(dir, std::numeric_limits<int64_t>::max());
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race a new holder)
}

std::string latest_checkpoint(const std::string& path, std::vector<std::string>* unreadable) {
  if (WEFT_FS(fs::exists(fs::path(path) / kCheckpointIndexFile))) return path;
  std::map<int64_t, fs::path> incomplete;
  auto all = complete_checkpoints(path, unreadable ? &incomplete : nullptr);
  for (const auto& [step, dir] : incomplete)
    unreadable->push_back(fmt::format("checkpoint: {} has no {}: not a complete checkpoint (weft publishes a step only "
                                      "with its index: it was cut short or edited by hand)", dir.string(),
                                      kCheckpointIndexFile));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {  // a step_N whose index records another step (a copy renamed) would be taken as step N
      const int64_t step = read_checkpoint_index(it->second.string()).training.step;
      WEFT_CHECK(step == it->first, "checkpoint: {} holds step {}, not the step its name says", it->second.string(), step);
      return it->second.string();
    } catch (const Error& e) {
      if (unreadable) unreadable->push_back(e.what());
    }
  }
  return {};
}

}  // namespace weft::fsdp
