// cuda/: core's device runtime (core/device_runtime.h) for CUDA: discovery, streams,
// events and pinned memory, over the CUDA runtime API. Handles are cudaStream_t / cudaEvent_t.
#include "core/device_runtime.h"

#include "cuda/allocator.h"
#include "cuda/check.h"
#include "cuda/runtime.h"

namespace weft::kernels::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

// cudaErrorNotReady is an answer, not an error.
bool ready(cudaError_t e) {
  if (e == cudaErrorNotReady) return false;
  WEFT_CUDA_CHECK(e);
  return true;
}

class CudaRuntime final : public DeviceRuntime {
 public:
  int device_count() override { return cuda::device_count(); }
  std::string unavailable_reason() override { return cuda::unavailable_reason(); }
  std::string describe(int index) override { return device_description(index); }
  void synchronize(int index) override { cuda::synchronize(index); }
  void* current_stream(int index) override { return cuda::current_stream(index); }
  void set_current_stream(int index, void* stream) override { cuda::set_current_stream(index, as_stream(stream)); }
  void* create_stream(int index, int priority) override {
    DeviceGuard g(index);
    cudaStream_t h = nullptr;
    WEFT_CUDA_CHECK(cudaStreamCreateWithPriority(&h, cudaStreamNonBlocking, priority));
    return h;
  }
  void destroy_stream(int index, void* stream) override {
    DeviceGuard g(index);
    cudaStreamDestroy(as_stream(stream));  // from destructors: nothing to report to
  }
  void synchronize_stream(int index, void* stream) override {
    DeviceGuard g(index);
    WEFT_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
  }
  bool query_stream(int index, void* stream) override {
    DeviceGuard g(index);
    return ready(cudaStreamQuery(as_stream(stream)));
  }
  void* create_event(int index, bool timing) override {
    DeviceGuard g(index);
    cudaEvent_t e = nullptr;
    WEFT_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  void destroy_event(int, void* event) override { cudaEventDestroy(as_event(event)); }
  void record_event(void* event, int index, void* stream) override {
    DeviceGuard g(index);
    WEFT_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream)));
  }
  void stream_wait_event(int index, void* stream, void* event) override {
    DeviceGuard g(index);
    WEFT_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
  }
  void synchronize_event(void* event) override { WEFT_CUDA_CHECK(cudaEventSynchronize(as_event(event))); }
  bool query_event(void* event) override { return ready(cudaEventQuery(as_event(event))); }
  float elapsed_ms(void* start, void* end) override {
    float ms = 0;
    WEFT_CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start), as_event(end)));
    return ms;
  }
  Tensor empty_pinned(const Shape& shape, DType dtype) override { return cuda::empty_pinned(shape, dtype); }
  bool is_pinned(const void* p) override { return cuda::is_pinned(p); }
};

}  // namespace

DeviceRuntime& device_runtime() {
  static CudaRuntime runtime;
  return runtime;
}

}  // namespace weft::kernels::cuda
