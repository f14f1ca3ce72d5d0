// cuda/: installs the CUDA backend at start-up: into core, the device runtime, the
// per-device caching allocators (so Storage, memory_stats and empty() work on cuda:i) and the
// device copy (so to/copy_/clone/contiguous/fill_ do); into kernels, the KernelBackend table
// every kernel entry point dispatches through. Registration only stores function pointers: the
// driver is first touched when a CUDA tensor is made, so CPU-only programs on a machine
// without a GPU are unaffected.
#include "core/copy.h"
#include "core/device_runtime.h"
#include "cuda/allocator.h"
#include "cuda/ops.h"

namespace weft::kernels::cuda {

DeviceRuntime& device_runtime();  // cuda/device_runtime.cpp

namespace {

Allocator& lookup_allocator(int index) { return device_allocator(index); }

const KernelBackend& kernel_table() {
  static const KernelBackend table = [] {
    KernelBackend t{};
    fill_elementwise_ops(t);
    fill_nn_ops(t);
    fill_gemm_ops(t);
    return t;
  }();
  return table;
}

// [Note: backend registration] in core/device_runtime.h; the NCCL group registers itself in
// nccl_group.cpp.
const bool g_registered = [] {
  register_device_runtime(DeviceType::cuda, &device_runtime());
  register_allocator_lookup(DeviceType::cuda, &lookup_allocator);
  register_device_copy(DeviceType::cuda, &copy);
  register_kernel_backend(DeviceType::cuda, &kernel_table());
  return true;
}();

}  // namespace
}  // namespace weft::kernels::cuda
