#include "apps/common/progress.h"

#include <unistd.h>

#include <cstdio>
#include <fmt/format.h>

namespace weft::apps {

std::string format_duration(double s) {
  if (s < 0 || s != s) return "?";
  int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

Progress::Progress(std::string label, int64_t total, std::string unit, double every_s)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), every_s_(every_s),
      tty_(isatty(fileno(stderr)) != 0), start_(std::chrono::steady_clock::now()), last_print_(start_) {}

void Progress::update(int64_t step, int64_t items, const std::string& note) {
  step_ = step;
  items_ += items;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_print_).count();
  if (since >= (tty_ ? 0.2 : every_s_) || step == total_) {
    last_print_ = now;
    print(step, note, false);
  }
}

void Progress::finish(const std::string& note) { print(step_, note, true); }

void Progress::print(int64_t step, const std::string& note, bool final) {
  double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = el > 0 ? double(items_) / el : 0;
  double eta = (total_ > 0 && step > 0) ? el / double(step) * double(total_ - step) : -1;
  std::string pos = total_ > 0 ? fmt::format("{}/{}", step, total_) : fmt::format("{}", step);
  std::string bar;
  if (tty_ && total_ > 0) {
    int width = 24, fill = int(double(width) * double(step) / double(total_));
    bar = "[" + std::string(size_t(fill), '#') + std::string(size_t(width - fill), '.') + "] ";
  }
  std::string line = fmt::format("{} {}{} | {:.0f} {}/s | {} {} | {}", label_, bar, pos, rate, unit_,
                                 final ? "took" : "ETA", format_duration(final ? el : eta), note);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace weft::apps
