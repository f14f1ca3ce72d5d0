// apps: progress reporting for long loops. On a terminal: one self-rewriting bar with rate
// and ETA; otherwise (logs, CI): a plain line every `every_s` seconds and at the end.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace weft::apps {

class Progress {
 public:
  // `unit` names what is counted ("samples", "tokens"); total may be 0 if unknown.
  Progress(std::string label, int64_t total_steps, std::string unit, double every_s = 5.0);
  // Records that `step` (1-based) is done and `items` more units were processed; `note`
  // (e.g. "loss 0.4312") is shown beside the bar.
  void update(int64_t step, int64_t items, const std::string& note);
  void finish(const std::string& note);

 private:
  void print(int64_t step, const std::string& note, bool final);
  std::string label_, unit_;
  int64_t total_, items_ = 0, step_ = 0;
  double every_s_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_print_;
};

std::string format_duration(double seconds);  // "1m05s", "2h03m", "12s"

}  // namespace weft::apps
