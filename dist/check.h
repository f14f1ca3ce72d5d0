// dist: checked calls into MPI, NCCL and CUDA. Each macro throws weft::Error naming the call,
// its file:line and the library's own error text. Internal header (not installed): the
// macros compare against the libraries' success codes, which are all 0.
#pragma once
#include <string>

#include "../core/error.h"

namespace weft::dist::detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(int code, const char* call, const char* file, int line);
[[noreturn]] void throw_cuda_error(int code, const char* call, const char* file, int line);
std::string mpi_error_string(int code);
}  // namespace weft::dist::detail

#define WEFT_DIST_CHECKED_CALL(kind, call)                                               \
  do {                                                                                   \
    int rc_ = int(call);                                                                 \
    if (rc_ != 0) [[unlikely]]                                                           \
      ::weft::dist::detail::throw_##kind##_error(rc_, #call, __FILE__, __LINE__);        \
  } while (0)

#define MPI_CHECK(call) WEFT_DIST_CHECKED_CALL(mpi, call)
#define NCCL_CHECK(call) WEFT_DIST_CHECKED_CALL(nccl, call)
#define CUDA_CHECK(call) WEFT_DIST_CHECKED_CALL(cuda, call)
