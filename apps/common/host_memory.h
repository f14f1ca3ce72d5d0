// apps: the memory this host can still give, for the checks that refuse work it cannot hold
// rather than leaving it to the kernel's OOM killer.
#pragma once
#include <cstdint>

namespace weft::apps {

// /proc/meminfo's MemAvailable in bytes (0: unknown).
int64_t host_available_bytes();

}  // namespace weft::apps
