#include "core/deterministic.h"

#include <atomic>

namespace weft {
namespace {
std::atomic<bool> g_deterministic{false};
}
void set_deterministic(bool on) { g_deterministic.store(on); }
bool deterministic() { return g_deterministic.load(); }
}  // namespace weft
