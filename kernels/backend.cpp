// kernels: the registry of KernelBackend tables, one per device type, and the lookup the
// public entry points dispatch through.
#include "kernels/backend.h"

#include <array>
#include <atomic>
#include <cstring>

#include "core/device_runtime.h"
#include "core/op_profiler.h"

namespace weft::kernels {
namespace {

// A function-local static: backends register from static initialisers, which may run before this file's own.
std::array<std::atomic<const KernelBackend*>, kNumDeviceTypes>& tables() {
  static std::array<std::atomic<const KernelBackend*>, kNumDeviceTypes> t{};
  return t;
}

// The table registered for `device`'s type (its backend library loaded on first use).
const KernelBackend& registered_table(Device device, const char* op) {
  auto& slot = tables()[size_t(device.type)];
  const KernelBackend* table = slot.load(std::memory_order_acquire);
  if (table == nullptr) {
    load_backend(device.type);  // its static initialisers register its table
    table = slot.load(std::memory_order_acquire);
  }
  if (table == nullptr) {
    std::string reason = backend_unavailable_reason(device.type);
    if (reason.empty()) reason = fmt::format("the {} backend registered no kernels", device_type_name(device.type));
    WEFT_ERROR("{}: no kernels for device {}: {}", op, device.str(), reason);
  }
  check_device(device, op);
  return *table;
}

}  // namespace

void register_kernel_backend(DeviceType type, const KernelBackend* table) {
  WEFT_CHECK(table != nullptr, "register_kernel_backend: null table for the {} backend", device_type_name(type));
  // A table is a run of function pointers: find an entry left unset, so that a backend
  // missing an op fails at start-up rather than crashing in the op.
  using Entry = void (*)();
  static_assert(sizeof(KernelBackend) % sizeof(Entry) == 0);
  std::array<Entry, sizeof(KernelBackend) / sizeof(Entry)> entries;
  std::memcpy(entries.data(), table, sizeof(KernelBackend));
  for (size_t i = 0; i < entries.size(); ++i)
    WEFT_CHECK(entries[i] != nullptr, "register_kernel_backend: the {} backend leaves entry {} of its table unset",
               device_type_name(type), i);
  tables()[size_t(type)].store(table, std::memory_order_release);
}

const KernelBackend& kernel_backend(Device device, const char* op) {
  WEFT_CHECK(!device.is_meta() || MetaComputeGuard::enabled(),
             "{}: an operand is on the meta device and has no data (deferred initialisation: materialise the "
             "module with nn::materialize or fsdp::fully_shard it before computing with it; shape propagation "
             "runs under a MetaComputeGuard)", op);
  // The CPU table is taken directly: it must not depend on static initialisation order.
  const KernelBackend& table = device.is_cpu()    ? cpu::kernel_table()
                               : device.is_meta() ? meta::kernel_table()
                                                  : registered_table(device, op);
  return op_profiler::wanted() ? timed_kernel_table(op, device, table) : table;
}

}  // namespace weft::kernels
