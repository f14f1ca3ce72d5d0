#include "core/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace weft {
namespace {

// Creates `<path>.tmp.<pid>.<n>` exclusively. open() with mode 0666 lets the umask decide the
// permissions, as for any ordinary new file (mkstemp would force 0600).
int create_temp(const std::string& path, std::string& tmp) {
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

// Removes `<path>.tmp.<pid>.<n>` of writers that are gone (best effort: what it cannot remove stays).
void remove_dead_temps(const std::filesystem::path& path) {
  const std::string prefix = path.filename().string() + ".tmp.";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(path.parent_path().empty() ? "." : path.parent_path(), ec)) {
    const std::string name = e.path().filename().string(), rest = name.substr(std::min(name.size(), prefix.size()));
    if (name.rfind(prefix, 0) == 0 && temp_owner_gone(rest.substr(0, rest.find('.')))) std::filesystem::remove(e.path(), ec);
  }
}

void fsync_parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_directory(dir.empty() ? "." : dir);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write, bool replace) {
  WEFT_CHECK(!path.empty(), "write_file_atomic: empty path");
  remove_dead_temps(path);
  std::string tmp;
  int fd = create_temp(path, tmp);
  WEFT_CHECK(fd >= 0, "write_file_atomic: cannot create temporary file '{}' for '{}': {}", tmp,
             path, std::strerror(errno));
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    std::string err = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    WEFT_ERROR("write_file_atomic: fdopen of temporary file '{}' for '{}' failed: {}", tmp, path, err);
  }
  // Everything up to the rename may fail; `path` must then stay as it was.
  try {
    write(f);
    WEFT_CHECK(!std::ferror(f), "write_file_atomic: writing '{}' failed: {}", path, std::strerror(errno));
    WEFT_CHECK(std::fflush(f) == 0, "write_file_atomic: flushing '{}' failed: {}", path, std::strerror(errno));
    WEFT_CHECK(::fsync(::fileno(f)) == 0, "write_file_atomic: fsync of '{}' failed: {}", path, std::strerror(errno));
  } catch (...) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::fclose(f) != 0) {
    std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    WEFT_ERROR("write_file_atomic: closing '{}' failed: {}", path, err);
  }
  // Not `replace`: published only where nothing is (a hard link fails on an existing name; the rename does not).
  const bool moved = replace ? ::rename(tmp.c_str(), path.c_str()) == 0 : ::link(tmp.c_str(), path.c_str()) == 0;
  if (!moved) {
    std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    WEFT_ERROR("write_file_atomic: {} '{}' to '{}' failed: {}", replace ? "renaming" : "linking", tmp, path, err);
  }
  if (!replace) ::unlink(tmp.c_str());
  fsync_parent_dir(path);
}

bool temp_owner_gone(const std::string& pid) {
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  return ::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH;
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  WEFT_CHECK(fd >= 0, "fsync_directory: cannot open directory '{}' to sync it: {}", dir, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems cannot sync a directory (EINVAL); the files themselves are already durable.
  WEFT_CHECK(rc == 0 || err == EINVAL, "fsync_directory: syncing directory '{}' failed: {}", dir, std::strerror(err));
}

}  // namespace weft
