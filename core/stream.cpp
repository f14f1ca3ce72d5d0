#include "core/stream.h"

#include <utility>

#include "core/device_runtime.h"
#include "core/error.h"

namespace weft {
namespace {

// The runtime of `device` (not the CPU) once the device is known to exist, so that a missing
// device is reported as such ("no CUDA device is visible") rather than by whatever call of
// the backend happens to fail first, or not at all (a current stream needs no driver call).
DeviceRuntime& checked_runtime(Device device, const char* op) {
  check_device(device, op);
  return device_runtime(device.type);
}

}  // namespace

Stream Stream::create(Device device, int priority) {
  if (runs_on_host(device)) return Stream();
  DeviceRuntime& rt = checked_runtime(device, "Stream::create");
  void* h = rt.create_stream(device.index, priority);
  int index = device.index;
  DeviceRuntime* r = &rt;
  return Stream(device, h, std::shared_ptr<void>(h, [r, index](void* s) { r->destroy_stream(index, s); }));
}

void Stream::synchronize() const {
  if (!runs_on_host(device_)) device_runtime(device_.type).synchronize_stream(device_.index, handle_);
}

bool Stream::query() const {
  return runs_on_host(device_) || device_runtime(device_.type).query_stream(device_.index, handle_);
}

void Stream::wait(const Event& event) const {
  if (runs_on_host(device_) || !event.recorded()) return;
  device_runtime(device_.type).stream_wait_event(device_.index, handle_, event.handle());
}

Stream current_stream(Device device) {
  if (runs_on_host(device)) return Stream();
  return Stream::wrap(device, checked_runtime(device, "current_stream").current_stream(device.index));
}

void set_current_stream(const Stream& stream) {
  Device d = stream.device();
  if (!runs_on_host(d)) device_runtime(d.type).set_current_stream(d.index, stream.handle());
}

void synchronize(Device device) {
  if (!runs_on_host(device)) device_runtime(device.type, "synchronize").synchronize(device.index);
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() { set_current_stream(previous_); }

Event::~Event() { release(); }

Event::Event(Event&& o) noexcept
    : device_(o.device_), handle_(std::exchange(o.handle_, nullptr)), timing_(o.timing_) {}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    release();
    device_ = o.device_;
    handle_ = std::exchange(o.handle_, nullptr);
    timing_ = o.timing_;
  }
  return *this;
}

void Event::release() noexcept {
  if (handle_ == nullptr) return;
  try {
    device_runtime(device_.type).destroy_event(device_.index, handle_);
  } catch (...) {  // destroying an event cannot be reported from a destructor
  }
  handle_ = nullptr;
}

void Event::record(const Stream& stream) {
  Device d = stream.device();
  if (runs_on_host(d)) {  // CPU work is done when it returns: the event is complete
    release();
    device_ = d;
    return;
  }
  DeviceRuntime& rt = checked_runtime(d, "Event::record");
  if (handle_ == nullptr || device_ != d) {
    release();
    handle_ = rt.create_event(d.index, timing_);
    device_ = d;
  }
  rt.record_event(handle_, d.index, stream.handle());
}

void Event::synchronize() const {
  if (handle_ != nullptr) device_runtime(device_.type).synchronize_event(handle_);
}

bool Event::query() const { return handle_ == nullptr || device_runtime(device_.type).query_event(handle_); }

float Event::elapsed_ms(const Event& end) const {
  WEFT_CHECK(timing_ && end.timing_, "Event::elapsed_ms: both events need enable_timing = true");
  WEFT_CHECK(handle_ != nullptr && end.handle_ != nullptr,
             "Event::elapsed_ms: both events must have been recorded on a device stream (CPU events time nothing)");
  WEFT_CHECK(device_ == end.device_, "Event::elapsed_ms: events on {} and {}", device_.str(), end.device_.str());
  return device_runtime(device_.type).elapsed_ms(handle_, end.handle_);
}

}  // namespace weft
