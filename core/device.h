// core: where a tensor lives. CPU always; CUDA(index) when the CUDA backend is built.
#pragma once
#include <string>

namespace weft {

enum class DeviceType : uint8_t { cpu, cuda };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int i = 0) { return {DeviceType::cuda, i}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

inline const Device kCPU = Device::cpu();

// "CPU" or "CUDA", for messages.
inline const char* device_type_name(DeviceType t) { return t == DeviceType::cuda ? "CUDA" : "CPU"; }

}  // namespace weft
