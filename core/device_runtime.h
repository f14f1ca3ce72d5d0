// core: the interface a device backend implements so that core can run it: device discovery, streams, events and pinned
// host memory.
// [Note: backend registration] A device backend is one shared library (libweft-cuda, built from cuda/) that fills one
// registry per concern, each owned by the layer that uses it: this DeviceRuntime (register_device_runtime), its
// allocator and copies (core/allocator.h, core/copy.h), its kernel table (kernels/backend.h) and its process group
// (dist/backend.h). It registers all of them from static initialisers when it is loaded, and core loads it
// (load_backend) the first time any registry is asked for that device type, so the layers above never link it and a
// program that never names a CUDA device never loads a CUDA library.
//
// Stream and event handles are opaque here (void*); nullptr is the device's default stream.
#pragma once
#include <string>

#include "device.h"
#include "dtype.h"
#include "shape.h"

namespace weft {

class Tensor;

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual int device_count() = 0;                  // 0 when no driver or device; never throws
  virtual std::string unavailable_reason() = 0;    // why device_count() is 0
  virtual std::string describe(int index) = 0;     // name and memory, e.g. "NVIDIA H100 80GB HBM3, 79.1 GiB"
  virtual void synchronize(int index) = 0;         // all streams of the device
  virtual void* current_stream(int index) = 0;
  virtual void set_current_stream(int index, void* stream) = 0;
  virtual void* create_stream(int index, int priority) = 0;  // non-blocking
  virtual void destroy_stream(int index, void* stream) = 0;
  virtual void synchronize_stream(int index, void* stream) = 0;
  virtual bool query_stream(int index, void* stream) = 0;
  virtual void* create_event(int index, bool timing) = 0;
  virtual void destroy_event(int index, void* event) = 0;
  virtual void record_event(void* event, int index, void* stream) = 0;
  virtual void stream_wait_event(int index, void* stream, void* event) = 0;
  virtual void synchronize_event(void* event) = 0;
  virtual bool query_event(void* event) = 0;
  virtual float elapsed_ms(void* start, void* end) = 0;
  // Page-locked host memory (CPU tensors), so that copies to and from the device are asynchronous.
  virtual Tensor empty_pinned(const Shape& shape, DType dtype) = 0;
  virtual bool is_pinned(const void* p) = 0;
};

// Called by a backend's shared library when it is loaded.
void register_device_runtime(DeviceType type, DeviceRuntime* runtime);

// Loads the backend library for `type` once (CPU: always there). Returns whether its runtime
// is registered; backend_unavailable_reason says why not (the loader's error text).
bool load_backend(DeviceType type);
std::string backend_unavailable_reason(DeviceType type);

// The runtime of a non-CPU device type, loading its backend; throws weft::Error naming the
// device and why its backend is missing. `op` prefixes the message.
DeviceRuntime& device_runtime(DeviceType type, const char* op = nullptr);

// Visible devices of a type (CPU: 1); 0 when its backend is missing or sees no device.
int device_count(DeviceType type);
// Why device_count(type) is 0 ("" when devices are visible).
std::string device_unavailable_reason(DeviceType type);
// Throws weft::Error unless `device` exists: e.g. "<op>: CUDA device 1 requested (cuda:1),
// but only 1 CUDA device is visible".
void check_device(Device device, const char* op = nullptr);
// "cpu" for the CPU, else the backend's description of the device.
std::string device_description(Device device);

// Pinned host memory through `device`'s backend (plain CPU memory when `device` is the CPU).
Tensor empty_pinned(const Shape& shape, DType dtype, Device device);
Tensor pin_memory(const Tensor& cpu_tensor, Device device);
bool is_pinned(const void* p, Device device);

}  // namespace weft
