#include "apps/common/checkpoint_watch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fmt/format.h>
#include <vector>

#include "fsdp/checkpoint.h"

namespace weft::apps {

CheckpointWatch::CheckpointWatch(const std::string& resumed, int64_t step, const std::map<int64_t, Recorded>& earlier) {
  for (auto& [s, r] : earlier) {
    if (s > step) break;
    if (r.loss) loss(s, *r.loss);  // judges the checkpoint of step s - 1, when there is one
    saved(s, r.path);
  }
  if (!resumed.empty()) saved(step, resumed);
}

bool CheckpointWatch::spike(double value) const {
  if (!std::isfinite(value)) return true;
  if (recent_.empty()) return false;  // the first loss: finiteness only
  std::vector<double> v(recent_.begin(), recent_.end());
  std::nth_element(v.begin(), v.begin() + ptrdiff_t(v.size() / 2), v.end());
  return value > kSpikeFactor * v[v.size() / 2];
}

void CheckpointWatch::loss(int64_t step, double value) {
  if (saved_.count(step - 1) && !judged_.count(step - 1)) judged_[step - 1] = !spike(value);
  if (!std::isfinite(value)) return;
  recent_.push_back(value);
  if (recent_.size() > kWindow) recent_.pop_front();
}

void CheckpointWatch::saved(int64_t step, const std::string& path) {
  saved_[step] = path;
  judged_.erase(step);  // a checkpoint of the same step written again is judged again
}

std::string CheckpointWatch::good() const {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    auto j = judged_.find(it->first);
    std::error_code ec;
    if (j != judged_.end() && j->second && std::filesystem::exists(std::filesystem::path(it->second) / "index.json", ec))
      return it->second;
  }
  return {};
}

std::string CheckpointWatch::advice() const {
  const std::string rule = fmt::format("its weights gave the next step a finite loss at most {}x the median of the "
                                       "{} before it", kSpikeFactor, kWindow);
  const std::string g = good();
  if (!g.empty()) return fmt::format("the newest checkpoint that resumes is {} ({})", g, rule);
  if (saved_.empty()) return "no checkpoint was written";
  return fmt::format("no checkpoint on disk is known to resume (none whose {})", rule.substr(4));
}

void CheckpointWatch::announce_kept(const std::string& program, const std::string& dir, int keep_last) {
  const std::string g = good();
  for (const std::string& kept : fsdp::older_kept_checkpoints(dir, keep_last))
    if (announced_.insert(kept == g ? std::string() : kept).second)  // "": the one known to resume, said once
      std::fprintf(stderr, "%s: keeping %s besides the %d newest: %s\n", program.c_str(), kept.c_str(), keep_last,
                   kept == g ? "the newest checkpoint known to resume (as at later saves, said once)" : "the lowest training loss or the one before");
}

}  // namespace weft::apps
