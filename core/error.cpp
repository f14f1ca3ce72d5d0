#include "core/error.h"

#include <cstring>

namespace weft::detail {

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg) {
  // Keep only the path from the project's layer folder on, so messages read "core/tensor.cpp:12".
  const char* short_file = file;
  for (const char* layer : {"core/", "kernels/", "autograd/", "nn/", "dist/", "fsdp/", "apps/"}) {
    if (const char* p = std::strstr(file, layer)) { short_file = p; break; }
  }
  throw Error(fmt::format("{} (at {}:{})", msg, short_file, line));
}

}  // namespace weft::detail
