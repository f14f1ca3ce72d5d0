// apps: metrics as JSON Lines — one JSON object per line, flushed as written, so a
// crashed run keeps everything logged before it.
#pragma once
#include <cstdio>
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
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& other) noexcept : file_(other.file_), path_(std::move(other.path_)) { other.file_ = nullptr; }
  void write(const std::map<std::string, MetricValue>& fields);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace weft::apps
