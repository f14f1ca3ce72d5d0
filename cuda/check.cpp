// cuda/: the error reporting behind WEFT_CUDA_CHECK and WEFT_CUBLAS_CHECK.
#include "cuda/check.h"

#include <cublas_v2.h>

#include "core/error.h"

namespace weft::kernels::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line) {
  // Clear the runtime's last-error state so the next, unrelated check does not report it again
  // (a sticky error, e.g. an illegal address, stays whatever we do: the context is lost).
  cudaGetLastError();
  const char* hint = "";
  if (code == cudaErrorInsufficientDriver || code == cudaErrorNoDevice)
    hint = "; no usable CUDA device or driver on this machine";
  else if (code == cudaErrorNoKernelImageForDevice)
    hint = "; weft's kernels are built as compute_90 PTX (+ sm_90 code where a GPU was visible at build time): this GPU needs other -gencode flags";
  ::weft::detail::throw_error(file, line, fmt::format("{} failed: {} ({}, CUDA error {}){}", expr,
                                                      cudaGetErrorString(code), cudaGetErrorName(code),
                                                      int(code), hint));
}

[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line) {
  ::weft::detail::throw_error(file, line, fmt::format("{} failed: {} (cuBLAS status {})", expr,
                                                      cublasGetStatusString(cublasStatus_t(status)), status));
}

[[noreturn]] void throw_message(const char* message, const char* file, int line) {
  ::weft::detail::throw_error(file, line, message);
}

}  // namespace weft::kernels::cuda::detail
