#include "dist/check.h"

#include <mpi.h>

namespace weft::dist::detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, size_t(len));
}

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  ::weft::detail::throw_error(file, line, fmt::format("{} failed: {} (MPI error {})", call, mpi_error_string(code), code));
}

}  // namespace weft::dist::detail
