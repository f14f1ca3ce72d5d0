// cuda/: the CUDA runtime as weft uses it: devices, the current device and the current
// stream. Header of the backend (docs/CUDA.md); only compiled when weft is built with CUDA
// (WEFT_WITH_CUDA), so include it under `#if WEFT_WITH_CUDA`. Streams and events as objects
// are core's (weft::Stream, weft::Event, weft::StreamGuard in core/stream.h), which reach this
// backend through its DeviceRuntime (cuda/device_runtime.cpp); the backend itself only
// needs the raw handle of the stream to issue work on.
//
// Rules:
// - Every kernel and copy weft issues for cuda:i runs on current_stream(i). Unless it was set
//   (set_current_stream, which weft::StreamGuard calls) that is the legacy default stream of
//   device i (nullptr), which orders against every other blocking stream, so code that never
//   touches streams is correct.
// - The current stream is per thread and per device (as in PyTorch): setting it on one
//   thread does not change what another thread uses.
// - Memory allocated while stream s is current is returned to s's pool when freed and is
//   reused only by later work on s, so it is safe without synchronising. A tensor used on
//   another stream must be kept alive until that stream's work is done (weft::Event).
// - Nothing here touches the driver until it is called: merely linking weft (or registering
//   the backend at start-up) costs nothing on a machine without a GPU.
#pragma once
#include <cuda_runtime.h>

#include <string>

namespace weft::kernels::cuda {

// Visible CUDA devices; 0 when there is no driver or no device (never throws). Asked once.
int device_count();
bool is_available();  // device_count() > 0
// Why device_count() is 0 ("" when devices are visible), e.g. the cudaGetDeviceCount error.
std::string unavailable_reason();
// Throws weft::Error unless cuda:index exists: "CUDA device 0 requested (cuda:0), but no CUDA
// device is visible (...)"; with `op`, the message starts with "<op>: " (weft::check_device).
void check_device(int index, const char* op = nullptr);

int current_device();
void set_device(int index);
// Waits for all work on the device (every stream); -1 means the current device.
void synchronize(int device = -1);
// Name and memory of a device, e.g. "NVIDIA H100 80GB HBM3, 79.1 GiB".
std::string device_description(int device);

// Makes `index` the current device for its scope and restores the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int index_ = -1;
};

// The stream weft's work for `device` (-1: current device) goes to on this thread; nullptr
// (the legacy default stream) unless set_current_stream chose another.
cudaStream_t current_stream(int device = -1);
// Sets it for `device` on this thread; nullptr goes back to the legacy default stream.
void set_current_stream(int device, cudaStream_t stream);

}  // namespace weft::kernels::cuda
