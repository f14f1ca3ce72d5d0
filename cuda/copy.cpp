// cuda/: copies where one side is a CUDA tensor (registered with core as the CUDA
// device copy, so Tensor::to, copy_, clone, contiguous and fill_ work on CUDA tensors).
//
// When a copy is asynchronous (returns before the data has moved):
// - device to device on one device: always; it is ordered on the current stream like a
//   kernel, which is all later work on that stream needs.
// - host to device and device to host: only when the host memory is pinned (empty_pinned,
//   pin_memory): the copy is queued on the current stream. Read a pinned destination only
//   after synchronising that stream (or an event recorded after the copy); do not modify a
//   pinned source before then. With pageable host memory (any ordinary CPU tensor, e.g. the
//   result of .to(kCPU)) the copy waits for the stream before returning.
// - between two devices: never; both streams are synchronised.
// Dtype conversion and strided layouts run as a kernel on the device side; the host side
// only ever sees contiguous memory of its own dtype (a host temporary when needed).
#include "core/copy.h"
#include "cuda/allocator.h"
#include "cuda/check.h"
#include "cuda/ops.h"
#include "cuda/runtime.h"

namespace weft::kernels::cuda {
namespace {

// Device to device on one device, any dtypes and strides.
void copy_on_device(const Tensor& dst, const Tensor& src) {
  DeviceGuard guard(dst.device().index);
  cudaStream_t s = stream_of(dst);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    WEFT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, s));
    return;
  }
  std::vector<Operand> o;
  Geometry g = plan(dst.shape(), {&dst, &src}, o);
  launch_copy(g, o[0], o[1], s);
}

// Whether every element of t is the same memory (a broadcast scalar, e.g. from fill_).
bool is_broadcast_scalar(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != 0) return false;
  return true;
}

// host (contiguous, on the CPU) -> device memory dst_ptr, nbytes, on the current stream of
// `device`; waits unless the host memory is pinned.
void upload(void* dst_ptr, const Tensor& host, int device) {
  cudaStream_t s = current_stream(device);
  WEFT_CUDA_CHECK(cudaMemcpyAsync(dst_ptr, host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice, s));
  if (!is_pinned(host.data_ptr())) WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
}

void host_to_device(const Tensor& dst, const Tensor& src) {
  int dev = dst.device().index;
  DeviceGuard guard(dev);
  if (is_broadcast_scalar(src) && dst.numel() > 1) {
    // One element up, then a stride-0 device copy fills dst (fill_, expand().copy_ ...).
    Tensor one = empty({}, {.dtype = src.dtype(), .device = dst.device()});
    Tensor host_one = src.as_strided({}, {}, src.offset());
    upload(one.data_ptr(), host_one.contiguous(), dev);
    copy_on_device(dst, one.expand(dst.shape()));
    return;
  }
  Tensor host = src.contiguous();
  if (dst.is_contiguous() && dst.dtype() == src.dtype()) {
    upload(dst.data_ptr(), host, dev);
    return;
  }
  Tensor staged = empty(src.shape(), {.dtype = src.dtype(), .device = dst.device()});
  upload(staged.data_ptr(), host, dev);
  copy_on_device(dst, staged);
}

void device_to_host(const Tensor& dst, const Tensor& src) {
  int dev = src.device().index;
  DeviceGuard guard(dev);
  cudaStream_t s = stream_of(src);
  // On the device: contiguous, in dst's dtype.
  Tensor dsrc = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    dsrc = empty(src.shape(), {.dtype = dst.dtype(), .device = src.device()});
    copy_on_device(dsrc, src);
  }
  Tensor host = dst.is_contiguous() ? dst : empty(dst.shape(), {.dtype = dst.dtype()});
  WEFT_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), dsrc.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost, s));
  if (host.is_same(dst) && is_pinned(dst.data_ptr())) return;  // async: the caller synchronises
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
  if (!host.is_same(dst)) copy_elements(dst, host);
}

void device_to_device_peer(const Tensor& dst, const Tensor& src) {
  // Convert on the source device, move the bytes, lay out on the destination device.
  Tensor packed = src;
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) {
    packed = empty(src.shape(), {.dtype = dst.dtype(), .device = src.device()});
    copy_on_device(packed, src);
  }
  Tensor landed = dst.is_contiguous() ? dst : empty(dst.shape(), {.dtype = dst.dtype(), .device = dst.device()});
  int sd = src.device().index, dd = dst.device().index;
  {
    // The legacy default stream (nullptr) is the current device's: make sd current.
    DeviceGuard guard(sd);
    WEFT_CUDA_CHECK(cudaStreamSynchronize(current_stream(sd)));  // packed is complete
  }
  DeviceGuard guard(dd);
  cudaStream_t s = current_stream(dd);
  WEFT_CUDA_CHECK(cudaMemcpyPeerAsync(landed.data_ptr(), dd, packed.data_ptr(), sd, landed.nbytes(), s));
  if (!landed.is_same(dst)) copy_on_device(dst, landed);
  // packed belongs to the source stream's pool; it may be reused as soon as it is freed.
  WEFT_CUDA_CHECK(cudaStreamSynchronize(s));
}

}  // namespace

void copy(const Tensor& dst, const Tensor& src) {
  WEFT_CHECK(dst.shape() == src.shape(), "copy: shapes differ, dst {} vs src {}", tensor_desc(dst), tensor_desc(src));
  if (dst.numel() == 0) return;
  const Device dd = dst.device(), sd = src.device();
  if (dd.is_cuda() && sd.is_cuda()) {
    if (dd.index == sd.index) copy_on_device(dst, src);
    else device_to_device_peer(dst, src);
  } else if (dd.is_cuda()) {
    host_to_device(dst, src);
  } else {
    device_to_host(dst, src);
  }
}

}  // namespace weft::kernels::cuda
