#include "core/device.h"

namespace weft {

namespace {
thread_local Device t_default_device = Device::cpu();
}

Device default_device() { return t_default_device; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(t_default_device) { t_default_device = device; }
DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

}  // namespace weft
