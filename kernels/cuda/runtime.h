// kernels/cuda: the CUDA runtime as weft uses it: devices, the current device, streams and
// events. Header of the backend (docs/CUDA.md); only compiled when weft is built with CUDA
// (WEFT_WITH_CUDA), so include it under `#if WEFT_WITH_CUDA`.
//
// Rules:
// - Every kernel and copy weft issues for cuda:i runs on current_stream(i). Unless a
//   StreamGuard says otherwise that is the legacy default stream of device i, which orders
//   against every other blocking stream, so code that never touches streams is correct.
// - The current stream is per thread and per device (as in PyTorch): a StreamGuard on one
//   thread does not change what another thread uses.
// - Memory allocated while stream s is current is returned to s's pool when freed and is
//   reused only by later work on s, so it is safe without synchronising. A tensor used on
//   another stream must be kept alive until that stream's work is done (Event, synchronize).
// - Nothing here touches the driver until it is called: merely linking weft (or registering
//   the backend at start-up) costs nothing on a machine without a GPU.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace weft::kernels::cuda {

// Visible CUDA devices; 0 when there is no driver or no device (never throws). Asked once.
int device_count();
bool is_available();  // device_count() > 0
// Why device_count() is 0 ("" when devices are visible), e.g. the cudaGetDeviceCount error.
std::string unavailable_reason();
// Throws weft::Error unless cuda:index exists: "CUDA device 0 requested (cuda:0), but no CUDA
// device is visible (...)"; with `op`, the message starts with "<op>: ".
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

class Event;

// A CUDA stream on one device. Copies share the underlying stream; a stream made by create()
// is destroyed when its last copy goes away (after its queued work, as cudaStreamDestroy does).
class Stream {
 public:
  Stream() = default;  // the legacy default stream of device 0
  // The legacy default stream of `device`.
  static Stream default_stream(int device);
  // A new stream on `device` (-1: current). non_blocking streams do not order against the
  // legacy default stream: order them with events. priority: lower is more urgent.
  static Stream create(int device = -1, bool non_blocking = true, int priority = 0);
  // Wraps a stream owned elsewhere (e.g. by another library); weft never destroys it.
  static Stream wrap(cudaStream_t handle, int device);

  cudaStream_t handle() const { return handle_; }
  int device() const { return device_; }
  bool is_default() const { return handle_ == nullptr; }
  void synchronize() const;        // waits until all queued work is done
  bool query() const;              // true when all queued work is done
  void wait(const Event& event) const;  // later work on this stream waits for the event
  bool operator==(const Stream& o) const { return handle_ == o.handle_ && device_ == o.device_; }

 private:
  cudaStream_t handle_ = nullptr;
  int device_ = 0;
  std::shared_ptr<void> owner_;  // set for streams made by create()
};

// The stream weft's work for `device` (-1: current device) goes to on this thread.
Stream current_stream(int device = -1);
// Sets it for stream.device() on this thread (prefer StreamGuard).
void set_current_stream(const Stream& stream);

// Makes `stream` current for its device (and that device current) for its scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  DeviceGuard device_;
};

// A CUDA event. Created on first record() on the recorded stream's device; an event never
// recorded counts as complete (query() true, synchronize() and waits return at once).
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void record() { record(current_stream()); }
  void wait(const Stream& stream) const { stream.wait(*this); }  // stream waits for this event
  void synchronize() const;  // host waits
  bool query() const;        // completed?
  // Milliseconds between this event and `end` (both recorded, with timing enabled).
  float elapsed_ms(const Event& end) const;
  cudaEvent_t handle() const { return event_; }
  bool recorded() const { return event_ != nullptr; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
  bool timing_ = false;
};

}  // namespace weft::kernels::cuda
