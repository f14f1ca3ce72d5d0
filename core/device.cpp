#include "core/device.h"

namespace weft {

namespace {
thread_local Device t_default_device = Device::cpu();
thread_local bool t_meta_compute = false;
}

Device default_device() { return t_default_device; }

DefaultDeviceGuard::DefaultDeviceGuard(Device device) : previous_(t_default_device) { t_default_device = device; }
DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

MetaComputeGuard::MetaComputeGuard() : previous_(t_meta_compute) { t_meta_compute = true; }
MetaComputeGuard::~MetaComputeGuard() { t_meta_compute = previous_; }
bool MetaComputeGuard::enabled() { return t_meta_compute; }

}  // namespace weft
