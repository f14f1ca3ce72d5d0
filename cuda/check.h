// cuda/: checked calls into the CUDA runtime and cuBLAS(Lt). Every call weft makes into
// them goes through one of these macros, so that a failure becomes a weft::Error naming the
// call, the file:line in weft and the library's own error string, never an ignored status.
//   WEFT_CUDA_CHECK(cudaMemcpyAsync(...));
//   WEFT_CUBLAS_CHECK(cublasLtMatmul(...));
//   kernel<<<grid, block, 0, stream>>>(...); WEFT_CUDA_CHECK_LAUNCH();
// Free of fmt and core/tensor.h so that nvcc-compiled .cu files can include it.
#pragma once
#include <cuda_runtime.h>

namespace weft::kernels::cuda::detail {

// Throw weft::Error; the message ends in "(at cuda/<file>:<line>)" as WEFT_CHECK's do.
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line);
[[noreturn]] void throw_message(const char* message, const char* file, int line);

}  // namespace weft::kernels::cuda::detail

#define WEFT_CUDA_CHECK(expr)                                                                  \
  do {                                                                                         \
    cudaError_t weft_cuda_status_ = (expr);                                                    \
    if (weft_cuda_status_ != cudaSuccess)                                                      \
      ::weft::kernels::cuda::detail::throw_cuda_error(weft_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// cublasStatus_t and cublasLt's statuses are both plain enums with 0 = success.
#define WEFT_CUBLAS_CHECK(expr)                                                                \
  do {                                                                                         \
    int weft_cublas_status_ = int(expr);                                                       \
    if (weft_cublas_status_ != 0)                                                              \
      ::weft::kernels::cuda::detail::throw_cublas_error(weft_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad launch (configuration, no device, no kernel image for this GPU)
// is reported here; a fault inside the kernel surfaces at the next synchronising call.
#define WEFT_CUDA_CHECK_LAUNCH() WEFT_CUDA_CHECK(cudaGetLastError())

// Raise weft::Error with a fixed message from code that cannot use fmt (.cu files).
#define WEFT_CUDA_FAIL(message) ::weft::kernels::cuda::detail::throw_message(message, __FILE__, __LINE__)
