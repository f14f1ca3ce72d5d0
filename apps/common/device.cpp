#include "apps/common/device.h"

#include "core/error.h"
#include "dist/dist.h"
#if WEFT_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace weft::apps {

Device parse_device(const std::string& name, const char* app) {
  if (name == "cpu") return kCPU;
  int index = -1;  // "cuda": this rank's GPU
  if (name.rfind("cuda:", 0) == 0) {
    const std::string digits = name.substr(5);
    WEFT_CHECK(!digits.empty() && digits.size() < 4 && digits.find_first_not_of("0123456789") == std::string::npos,
               "{}: --device {}: expected cpu, cuda or cuda:N", app, name);
    index = std::stoi(digits);
  } else {
    WEFT_CHECK(name == "cuda", "{}: --device {}: expected cpu, cuda or cuda:N", app, name);
  }
#if WEFT_WITH_CUDA
  int count = kernels::cuda::device_count();
  WEFT_CHECK(count > 0, "{}: --device {}: no CUDA device is visible ({}); use --device cpu", app, name,
             kernels::cuda::unavailable_reason());
  if (index < 0) index = dist::is_initialized() ? dist::local_rank() % count : 0;
  WEFT_CHECK(index < count, "{}: --device {}: only {} CUDA device(s) are visible (cuda:0 to cuda:{})", app, name,
             count, count - 1);
  return Device::cuda(index);
#else
  WEFT_ERROR("{}: --device {}: weft was built without CUDA (reconfigure with meson setup -Dcuda=enabled on a machine "
             "with the CUDA toolkit); use --device cpu", app, name);
#endif
}

}  // namespace weft::apps
