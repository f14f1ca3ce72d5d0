// apps: which checkpoint of a training run is known to resume. A checkpoint written after step k holds the weights
// whose loss step k+1 logs, so it is judged then: "good" when that loss is finite and not a spike, i.e. at most
// kSpikeFactor times the median of the (up to kWindow) finite losses logged before it (the first step's loss, with none
// before it, only by finiteness). A resumed run first replays the losses its earlier checkpoints recorded, so that the
// first steps after a resume are judged against the run's history as the uninterrupted run would. When a run stops on a
// non-finite loss, or gives up skipping such steps, it names the newest good checkpoint still on disk: the newest one
// written may hold weights that are finite but already diverged. See docs/CHECKPOINTS.md ("Divergence").
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace weft::apps {

class CheckpointWatch {
 public:
  static constexpr double kSpikeFactor = 2.0;
  static constexpr size_t kWindow = 16;

  struct Recorded {  // a checkpoint the run wrote earlier, and the loss its index records
    std::string path;
    std::optional<double> loss;
  };
  // `resumed`: the checkpoint this run started from at `step` (judged by the first loss), or empty;
  // `earlier`: its run's checkpoints by step, replayed up to `step` as if this run had logged them.
  CheckpointWatch(const std::string& resumed, int64_t step, const std::map<int64_t, Recorded>& earlier = {});
  // The loss logged at `step` (the mean over the global batch, computed with step-1's weights).
  void loss(int64_t step, double value);
  // A checkpoint written after `step`.
  void saved(int64_t step, const std::string& path);
  // Non-finite, or a spike against the recent losses.
  bool spike(double value) const;
  // The newest good checkpoint still on disk; empty when there is none.
  std::string good() const;
  // For messages: "the newest checkpoint that resumes is DIR (RULE)" or why there is none.
  std::string advice() const;
  // After a save to `dir` with --keep-last `keep_last`: says once (on stderr, as `program`) why each older
  // checkpoint outlived the rotation (the lowest loss; the newest that resumes, moving on, the first time).
  void announce_kept(const std::string& program, const std::string& dir, int keep_last);

 private:
  std::deque<double> recent_;                 // the last kWindow finite losses
  std::map<int64_t, std::string> saved_;      // step -> checkpoint directory
  std::map<int64_t, bool> judged_;            // step -> good
  std::set<std::string> announced_;           // older checkpoints announce_kept has named
};

}  // namespace weft::apps
