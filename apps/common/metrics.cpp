#include "apps/common/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace weft::apps {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  // A FIFO would block fopen() until a reader comes (for ever, in a batch job); a device or a
  // directory is no place for a log. A new file is fine.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  WEFT_CHECK(!std::filesystem::exists(st) || std::filesystem::is_regular_file(st),
             "metrics: {} exists and is not a regular file (a FIFO, device or directory?)", path);
  file_ = std::fopen(path.c_str(), "a");
  WEFT_CHECK(file_ != nullptr, "metrics: cannot open {} for writing: {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const std::map<std::string, MetricValue>& fields) {
  if (!file_) return;
  nlohmann::json j = nlohmann::json::object();
  for (auto& [k, v] : fields) std::visit([&](auto&& x) { j[k] = x; }, v);
  std::string line = j.dump() + "\n";
  WEFT_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
             "metrics: writing {} failed: {}", path_, std::strerror(errno));
}

}  // namespace weft::apps
