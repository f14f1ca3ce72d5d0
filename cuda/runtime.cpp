// cuda/: devices and the current stream (see runtime.h for the rules).
#include "cuda/runtime.h"

#include <vector>

#include "core/device_runtime.h"
#include "core/error.h"
#include "cuda/check.h"

namespace weft::kernels::cuda {
namespace {

struct DeviceInfo {
  int count = 0;
  std::string reason;
};

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int n = 0;  // cudaGetDeviceCount leaves it unwritten when there is no driver
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not an error of the caller's next call
      d.reason = fmt::format("cudaGetDeviceCount: {} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
      n = 0;
    } else if (n == 0) {
      d.reason = "cudaGetDeviceCount found no device";
    }
    d.count = n;
    return d;
  }();
  return info;
}

// Per thread, indexed by device: the stream set by set_current_stream; devices past the end
// are on the legacy default stream (nullptr).
thread_local std::vector<cudaStream_t> t_streams;

int resolve(int device) { return device < 0 ? current_device() : device; }

}  // namespace

int device_count() { return device_info().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return device_info().reason; }

// Core words the message for every device type; it reaches this backend's device_count()
// through the registered DeviceRuntime.
void check_device(int index, const char* op) { weft::check_device(Device::cuda(index), op); }

int current_device() {
  check_device(0);  // a clear message when there is none
  int d = 0;
  WEFT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  check_device(index);
  WEFT_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize(int device) {
  DeviceGuard g(resolve(device));
  WEFT_CUDA_CHECK(cudaDeviceSynchronize());
}

std::string device_description(int device) {
  check_device(device);
  cudaDeviceProp p{};
  WEFT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  return fmt::format("{}, {:.1f} GiB, sm_{}{}", p.name, double(p.totalGlobalMem) / double(1 << 30), p.major, p.minor);
}

DeviceGuard::DeviceGuard(int index) : index_(index) {
  check_device(index);
  WEFT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) WEFT_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != index_) cudaSetDevice(previous_);  // destructors do not throw
}

cudaStream_t current_stream(int device) {
  int d = resolve(device);
  return size_t(d) < t_streams.size() ? t_streams[size_t(d)] : nullptr;
}

void set_current_stream(int device, cudaStream_t stream) {
  check_device(device);
  if (t_streams.size() <= size_t(device)) t_streams.resize(size_t(device) + 1, nullptr);
  t_streams[size_t(device)] = stream;
}

}  // namespace weft::kernels::cuda
