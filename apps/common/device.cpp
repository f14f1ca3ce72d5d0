#include "apps/common/device.h"

#include "core/device_runtime.h"
#include "core/error.h"
#include "dist/dist.h"

namespace weft::apps {

Device parse_device(const std::string& name, const char* app) {
  if (name == "cpu") return kCPU;
  int index = -1;  // "cuda": this rank's GPU
  if (name.rfind("cuda:", 0) == 0) {
    const std::string digits = name.substr(5);
    WEFT_CHECK(!digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos,
               "{}: --device {}: expected cpu, cuda or cuda:N", app, name);
    index = std::stoi(digits);
  } else {
    WEFT_CHECK(name == "cuda", "{}: --device {}: expected cpu, cuda or cuda:N", app, name);
  }
  const int count = device_count(DeviceType::cuda);
  WEFT_CHECK(index < count || index < 0, "{}: --device {}: there is no such device: {}", app, name,
             count == 0 ? cuda_unavailable_reason()
                        : fmt::format("only {} CUDA device(s) are visible (cuda:0 to cuda:{})", count, count - 1));
  WEFT_CHECK(count > 0, "{}: --device {}: {}; use --device cpu", app, name, cuda_unavailable_reason());
  if (index < 0) return dist::local_device(DeviceType::cuda);
  return Device::cuda(index);
}

std::string cuda_unavailable_reason() {
  if (device_count(DeviceType::cuda) > 0) return "";
  // A missing backend explains itself ("weft was built without CUDA ..."); a loaded one that
  // sees no device gives the driver's reason.
  const std::string why = device_unavailable_reason(DeviceType::cuda);
  return load_backend(DeviceType::cuda) ? "no CUDA device is visible (" + why + ")" : why;
}

}  // namespace weft::apps
