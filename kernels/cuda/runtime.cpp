// kernels/cuda: devices, streams and events (see runtime.h for the rules).
#include "kernels/cuda/runtime.h"

#include <mutex>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/check.h"

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

// Per thread, per device: the stream made current by set_current_stream (default: legacy).
std::vector<Stream>& thread_streams() {
  thread_local std::vector<Stream> streams;
  return streams;
}

int resolve(int device) { return device < 0 ? current_device() : device; }

}  // namespace

int device_count() { return device_info().count; }
bool is_available() { return device_count() > 0; }
std::string unavailable_reason() { return device_info().reason; }

void check_device(int index, const char* op) {
  const DeviceInfo& d = device_info();
  std::string prefix = op ? fmt::format("{}: ", op) : "";
  if (d.count == 0)
    WEFT_ERROR("{}CUDA device {} requested (cuda:{}), but no CUDA device is visible ({})", prefix, index, index,
               d.reason);
  WEFT_CHECK(index >= 0 && index < d.count, "{}CUDA device {} requested (cuda:{}), but only {} device(s) are "
             "visible (cuda:0 .. cuda:{})", prefix, index, index, d.count, d.count - 1);
}

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

// ---------------------------------------------------------------- streams

Stream Stream::default_stream(int device) {
  Stream s;
  s.device_ = resolve(device);
  return s;
}

Stream Stream::create(int device, bool non_blocking, int priority) {
  Stream s;
  s.device_ = resolve(device);
  DeviceGuard g(s.device_);
  cudaStream_t h = nullptr;
  WEFT_CUDA_CHECK(cudaStreamCreateWithPriority(&h, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault, priority));
  s.handle_ = h;
  s.owner_ = std::shared_ptr<void>(static_cast<void*>(h), [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  return s;
}

Stream Stream::wrap(cudaStream_t handle, int device) {
  Stream s;
  s.handle_ = handle;
  s.device_ = device;
  return s;
}

void Stream::synchronize() const {
  DeviceGuard g(device_);
  WEFT_CUDA_CHECK(cudaStreamSynchronize(handle_));
}

bool Stream::query() const {
  DeviceGuard g(device_);
  cudaError_t e = cudaStreamQuery(handle_);
  if (e == cudaErrorNotReady) return false;  // not an error: nothing to clear
  WEFT_CUDA_CHECK(e);
  return true;
}

void Stream::wait(const Event& event) const {
  if (!event.recorded()) return;
  DeviceGuard g(device_);
  WEFT_CUDA_CHECK(cudaStreamWaitEvent(handle_, event.handle(), 0));
}

Stream current_stream(int device) {
  int d = resolve(device);
  auto& streams = thread_streams();
  if (size_t(d) < streams.size() && streams[size_t(d)].device() == d) return streams[size_t(d)];
  return Stream::default_stream(d);
}

void set_current_stream(const Stream& stream) {
  check_device(stream.device());
  auto& streams = thread_streams();
  if (streams.size() <= size_t(stream.device())) {
    // Fill with each device's default stream so that unset entries stay correct.
    for (int d = int(streams.size()); d <= stream.device(); ++d) streams.push_back(Stream::wrap(nullptr, d));
  }
  streams[size_t(stream.device())] = stream;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())), device_(stream.device()) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  try {
    set_current_stream(previous_);
  } catch (...) {
  }
}

// ---------------------------------------------------------------- events

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

Event::Event(Event&& o) noexcept : event_(o.event_), device_(o.device_), timing_(o.timing_) { o.event_ = nullptr; }

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_) cudaEventDestroy(event_);
    event_ = o.event_;
    device_ = o.device_;
    timing_ = o.timing_;
    o.event_ = nullptr;
  }
  return *this;
}

void Event::record(const Stream& stream) {
  DeviceGuard g(stream.device());
  if (event_ && device_ != stream.device()) {
    WEFT_CUDA_CHECK(cudaEventDestroy(event_));  // events belong to one device
    event_ = nullptr;
  }
  if (!event_) {
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    device_ = stream.device();
  }
  WEFT_CUDA_CHECK(cudaEventRecord(event_, stream.handle()));
}

void Event::synchronize() const {
  if (event_) WEFT_CUDA_CHECK(cudaEventSynchronize(event_));
}

bool Event::query() const {
  if (!event_) return true;
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;  // not an error: nothing to clear
  WEFT_CUDA_CHECK(e);
  return true;
}

float Event::elapsed_ms(const Event& end) const {
  WEFT_CHECK(timing_ && end.timing_, "cuda::Event::elapsed_ms: both events need enable_timing = true");
  WEFT_CHECK(event_ && end.event_, "cuda::Event::elapsed_ms: both events must have been recorded");
  float ms = 0;
  WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace weft::kernels::cuda
