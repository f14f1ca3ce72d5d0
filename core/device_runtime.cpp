#include "core/device_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "core/tensor.h"

// Set by the build: the file name of the CUDA backend library, and whether it was built.
#ifndef WEFT_CUDA_BACKEND_FILE
#define WEFT_CUDA_BACKEND_FILE "libweft-cuda.so"
#endif
#ifndef WEFT_CUDA_BACKEND_BUILT
#define WEFT_CUDA_BACKEND_BUILT 0
#endif

namespace weft {
namespace {

struct BackendSlot {
  std::once_flag loaded;
  DeviceRuntime* runtime = nullptr;
  std::string reason;  // why loading failed
};
BackendSlot g_slots[kNumDeviceTypes];

// The directory holding libweft-core itself: backends are installed beside it.
std::string core_library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_backend), &info) == 0 || info.dli_fname == nullptr) return "";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}

// dlopen()s the CUDA backend: $WEFT_CUDA_BACKEND if set, else the file beside libweft-core,
// else the name through the loader's search path. Its static initialisers register it.
void load_cuda(BackendSlot& slot) {
  const char* env = std::getenv("WEFT_CUDA_BACKEND");  // empty: as if unset
  if (!WEFT_CUDA_BACKEND_BUILT && (env == nullptr || *env == 0)) {
    slot.reason = "weft was built without CUDA (reconfigure with -Dcuda=enabled where the CUDA toolkit, "
                  "cuBLAS and NCCL are installed)";
    return;
  }
  std::vector<std::string> candidates;
  if (env != nullptr && *env != 0) {
    candidates.push_back(env);
  } else {
    std::string dir = core_library_dir();
    if (!dir.empty()) candidates.push_back(dir + "/" + WEFT_CUDA_BACKEND_FILE);
    candidates.push_back(WEFT_CUDA_BACKEND_FILE);
  }
  std::string errors;
  for (const std::string& c : candidates) {
    if (dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) {
      if (slot.runtime == nullptr) slot.reason = c + " loaded but registered no CUDA runtime";
      return;
    }
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : c + ": unknown dlopen error");
  }
  slot.reason = "weft's CUDA backend could not be loaded (" + errors + ")";
}

}  // namespace

void register_device_runtime(DeviceType type, DeviceRuntime* runtime) { g_slots[int(type)].runtime = runtime; }

bool load_backend(DeviceType type) {
  if (type == DeviceType::cpu) return true;
  BackendSlot& slot = g_slots[int(type)];
  std::call_once(slot.loaded, [&] {
    if (slot.runtime == nullptr && type == DeviceType::cuda) load_cuda(slot);
  });
  return slot.runtime != nullptr;
}

std::string backend_unavailable_reason(DeviceType type) {
  return load_backend(type) ? "" : g_slots[int(type)].reason;
}

DeviceRuntime& device_runtime(DeviceType type, const char* op) {
  WEFT_CHECK(type != DeviceType::cpu, "device_runtime: the CPU has no device runtime");
  if (!load_backend(type))
    WEFT_ERROR("{}{} device requested, but {}", op ? op : "", op ? ": " : "", backend_unavailable_reason(type));
  return *g_slots[int(type)].runtime;
}

int device_count(DeviceType type) {
  if (type == DeviceType::cpu) return 1;
  return load_backend(type) ? g_slots[int(type)].runtime->device_count() : 0;
}

std::string device_unavailable_reason(DeviceType type) {
  if (type == DeviceType::cpu) return "";
  if (!load_backend(type)) return backend_unavailable_reason(type);
  return g_slots[int(type)].runtime->unavailable_reason();
}

void check_device(Device device, const char* op) {
  if (device.is_cpu() || device.is_meta()) return;  // always there
  DeviceRuntime& rt = device_runtime(device.type, op);
  int count = rt.device_count();
  std::string prefix = op ? std::string(op) + ": " : "";
  WEFT_CHECK(count > 0, "{}{} device {} requested ({}), but no {} device is visible ({})", prefix,
             device_type_name(device.type), device.index, device.str(), device_type_name(device.type), rt.unavailable_reason());
  WEFT_CHECK(device.index >= 0 && device.index < count,
             "{}{} device {} requested ({}), but only {} {} device(s) are visible", prefix, device_type_name(device.type),
             device.index, device.str(), count, device_type_name(device.type));
}

std::string device_description(Device device) {
  if (device.is_cpu()) return "cpu";
  check_device(device, "device_description");
  return device_runtime(device.type).describe(device.index);
}

Tensor empty_pinned(const Shape& shape, DType dtype, Device device) {
  if (device.is_cpu()) return empty(shape, TensorOptions{.dtype = dtype});
  return device_runtime(device.type, "empty_pinned").empty_pinned(shape, dtype);
}

Tensor pin_memory(const Tensor& cpu_tensor, Device device) {
  WEFT_CHECK(cpu_tensor.device().is_cpu(), "pin_memory: expected a CPU tensor, got {}", tensor_desc(cpu_tensor));
  if (device.is_cpu()) return cpu_tensor;
  Tensor out = empty_pinned(cpu_tensor.shape(), cpu_tensor.dtype(), device);
  out.copy_(cpu_tensor);
  return out;
}

bool is_pinned(const void* p, Device device) {
  if (device.is_cpu()) return false;
  return device_runtime(device.type, "is_pinned").is_pinned(p);
}

}  // namespace weft
