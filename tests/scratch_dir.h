// tests: a directory of this test process's own under the temp directory (NAME_PID), removed
// with its contents when the object is destroyed: a namespace-scope one lasts the program, so
// that no run leaves files behind.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace weft::test {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // path() / name, made anew: empty.
  std::filesystem::path fresh(const std::string& name) const {
    const std::filesystem::path d = path_ / name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace weft::test
