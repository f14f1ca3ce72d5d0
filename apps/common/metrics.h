// apps: metrics as JSON Lines — one JSON object per line, flushed as written, so a
// crashed run keeps everything logged before it. A line that cannot be written (a full disk, a
// file-size limit) is dropped with a warning and cut back off the file, so that the file holds
// whole lines only: a log is never worth a run, and training goes on to its checkpoints.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>

namespace weft::apps {

using MetricValue = std::variant<int64_t, double, std::string>;

class MetricsWriter {
 public:
  MetricsWriter() = default;  // disabled: write() does nothing
  // Opens `path` for appending (append keeps earlier runs when resuming); empty = disabled.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();  // says how many lines were dropped, if any
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept
      : fd_(other.fd_), path_(std::move(other.path_)), dropped_(other.dropped_) {
    other.fd_ = -1;
  }
  void write(const std::map<std::string, MetricValue>& fields);

 private:
  int fd_ = -1;
  std::string path_;
  int64_t dropped_ = 0;
};

}  // namespace weft::apps
