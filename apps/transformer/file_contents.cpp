#include "apps/transformer/file_contents.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"

namespace weft::apps {

std::string read_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  WEFT_CHECK(fs::is_regular_file(st), "transformer: cannot read {}: {}", path, ec ? ec.message()
             : fs::is_directory(st) ? "it is a directory" : "it is not a regular file (a FIFO or device?)");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  WEFT_CHECK(f, "transformer: cannot open {}: {}", path, std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  const int error = std::ferror(f) ? errno : 0;
  std::fclose(f);
  WEFT_CHECK(!error, "transformer: error while reading {}: {}", path, std::strerror(error));
  return text;
}

void write_file(const std::string& path, const std::string& text) {
  write_file_atomic(path, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

nlohmann::json read_json_object(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    WEFT_ERROR("transformer: {} is not valid JSON: {}", path, e.what());
  }
  WEFT_CHECK(j.is_object(), "transformer: {} is not a JSON object (it holds a JSON {})", path, j.type_name());
  return j;
}

}  // namespace weft::apps
