#include "apps/common/host_memory.h"

#include <cstdio>

namespace weft::apps {

int64_t host_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (std::fgets(line, sizeof line, f) && std::sscanf(line, "MemAvailable: %lld kB", &kb) != 1) kb = 0;
  std::fclose(f);
  return kb * 1024;
}

}  // namespace weft::apps
