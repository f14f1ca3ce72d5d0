#include "apps/common/metrics.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  WEFT_CHECK(fd_ >= 0, "metrics: cannot open {} for writing: {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (dropped_ > 0) std::fprintf(stderr, "metrics: %lld line(s) could not be written to %s\n", (long long)dropped_, path_.c_str());
}

void MetricsWriter::write(const std::map<std::string, MetricValue>& fields) {
  if (fd_ < 0) return;
  nlohmann::json j = nlohmann::json::object();
  for (auto& [k, v] : fields) std::visit([&](auto&& x) { j[k] = x; }, v);
  const std::string line = j.dump() + "\n";
  struct stat st {};
  const bool sized = ::fstat(fd_, &st) == 0;
  size_t done = 0;
  errno = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w > 0) done += size_t(w);
    else if (w < 0 && errno == EINTR) continue;
    else break;  // 0 bytes, or an error (ENOSPC, EFBIG, EIO)
  }
  if (done == line.size()) return;
  const int err = errno != 0 ? errno : EIO;
  const bool cut = sized && ::ftruncate(fd_, st.st_size) == 0;  // a partial line's bytes off the file
  if (dropped_++ == 0 || !cut)
    std::fprintf(stderr, "metrics: writing %s failed: %s; training goes on%s\n", path_.c_str(), std::strerror(err),
                 cut ? " (each line that cannot be written is dropped)" : ", and the file may end in a partial line");
}

}  // namespace weft::apps
