// core: streams and events, the device-neutral way to order work between queues. A Stream is a queue of device work; an
// Event marks a point in one so that another queue (or the host) can wait for it. Device backends implement them
// (core/device_runtime.h); on the CPU every op runs synchronously on the calling thread, so CPU streams and events are
// no-ops: an event recorded on a CPU stream is complete at once. Code above core (dist, fsdp) orders its collectives
// with these and never names a device library.
//
// [Note: stream and event lifetimes] (as in PyTorch; cited where a rule is relied on)
// - Work weft issues for a device runs on that device's current stream. Unless a
//   StreamGuard says otherwise that is the device's default stream.
// - The current stream is per thread and per device.
// - Work on one stream that reads what another stream wrote waits on an Event recorded after
//   the write (stream_wait), never on the host, except where a timeout must be able to fire.
// - A tensor used on a stream other than the one it was allocated on must be kept alive until
//   that stream's work is done: record an Event after its last use there, and free it only
//   after that Event completes (fsdp/comm_context.h's release_after; the NCCL group keeps a
//   collective's tensors with its Work until its event completes).
#pragma once
#include <memory>

#include "device.h"

namespace weft {

class Event;

class Stream {
 public:
  Stream() = default;  // the CPU stream
  // The default stream of `device`.
  static Stream default_stream(Device device) { return Stream(device, nullptr, nullptr); }
  // A new stream that does not order against the default stream (order it with events);
  // lower priority is more urgent. Destroyed when its last copy goes away.
  static Stream create(Device device, int priority = 0);
  // Wraps a backend handle owned elsewhere (e.g. a cudaStream_t); weft never destroys it.
  static Stream wrap(Device device, void* handle) { return Stream(device, handle, nullptr); }

  Device device() const { return device_; }
  void* handle() const { return handle_; }  // the backend's handle; nullptr: default stream
  void synchronize() const;                  // host waits for all queued work
  bool query() const;                        // all queued work done?
  void wait(const Event& event) const;       // later work on this stream waits for `event`
  bool operator==(const Stream& o) const { return device_ == o.device_ && handle_ == o.handle_; }

 private:
  Stream(Device device, void* handle, std::shared_ptr<void> owner)
      : device_(device), handle_(handle), owner_(std::move(owner)) {}
  Device device_ = Device::cpu();
  void* handle_ = nullptr;
  std::shared_ptr<void> owner_;  // set for streams made by create()
};

// Whether work for `device` is done when the call that issues it returns: the CPU, and the
// meta device (shape propagation, memory plans). Such devices have no streams or events to
// wait on, and buffers handed to their work may be reused at once.
inline bool runs_on_host(Device device) { return device.is_cpu() || device.is_meta(); }

// The stream work for `device` goes to on this thread.
Stream current_stream(Device device);
// Sets it for stream.device() on this thread (prefer StreamGuard).
void set_current_stream(const Stream& stream);
// Waits on the host for all work on `device`, every stream (no-op on CPU).
void synchronize(Device device);

// Makes `stream` current for its device for its scope.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Created by the backend on the first record(); an event never recorded counts as complete.
class Event {
 public:
  explicit Event(bool enable_timing = false) : timing_(enable_timing) {}
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& stream);
  void synchronize() const;  // host waits
  bool query() const;        // completed?
  // Milliseconds between this event and `end` (both recorded on one device, timing enabled).
  float elapsed_ms(const Event& end) const;
  bool recorded() const { return handle_ != nullptr; }
  Device device() const { return device_; }
  void* handle() const { return handle_; }

 private:
  void release() noexcept;
  Device device_ = Device::cpu();
  void* handle_ = nullptr;
  bool timing_ = false;
};

}  // namespace weft
