// core: whether operations record autograd graphs on this thread. Lives in core because
// core's in-place methods consult it; autograd::NoGradGuard is the user-facing switch.
#pragma once

namespace weft {

class GradMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// RAII: disables graph recording in its scope (restores the previous mode on exit).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(GradMode::is_enabled()) { GradMode::set_enabled(false); }
  ~NoGradGuard() { GradMode::set_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace weft
