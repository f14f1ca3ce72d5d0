// core: where a tensor lives. CPU always; CUDA(index) when the CUDA backend is built; meta
// (shape and dtype only, no storage: modules built on it cost no memory, and fill_rule.h
// records how their parameters are to be initialised once they get a real device).
#pragma once
#include <cstdint>
#include <string>

namespace weft {

enum class DeviceType : uint8_t { cpu, cuda, meta };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  static Device meta() { return {DeviceType::meta, 0}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool is_meta() const { return type == DeviceType::meta; }
  bool operator==(const Device&) const = default;
  std::string str() const {
    return is_cpu() ? "cpu" : is_meta() ? "meta" : "cuda:" + std::to_string(index);
  }
};

inline const Device kCPU = Device::cpu();

// "CPU", "CUDA" or "meta", for messages.
inline const char* device_type_name(DeviceType t) {
  return t == DeviceType::cuda ? "CUDA" : t == DeviceType::meta ? "meta" : "CPU";
}

// The device factories use when their options name none (TensorOptions' default): the CPU
// unless a DefaultDeviceGuard on this thread says otherwise. Building a model under
// `DefaultDeviceGuard g(Device::meta())` gives it meta parameters (deferred initialisation).
Device default_device();

// Shape propagation. Inside a MetaComputeGuard, ops on meta tensors run: their outputs get shapes, dtypes and strides
// and no values, and the meta device's allocator counts the bytes they would hold (memory_stats(Device::meta()): live
// and peak), so a forward and backward of a model built on the meta device show its activation memory without
// allocating any. Outside the guard, computing with a meta tensor is an error that says to materialise it first.
class MetaComputeGuard {
 public:
  MetaComputeGuard();
  ~MetaComputeGuard();
  MetaComputeGuard(const MetaComputeGuard&) = delete;
  MetaComputeGuard& operator=(const MetaComputeGuard&) = delete;
  static bool enabled();  // on this thread

 private:
  bool previous_;
};

class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(Device device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace weft
