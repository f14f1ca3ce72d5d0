// dist: stands in for the NCCL backend when weft is built without CUDA (-Dcuda=disabled, or
// no toolkit found), so CUDA groups fail with a clear error instead of a link error.
#include "dist/backend.h"

namespace weft::dist::detail {

ProcessGroupPtr new_nccl_group(MPI_Comm comm, std::string name) {
  MPI_Comm_free(&comm);
  WEFT_ERROR("dist: group '{}' on CUDA needs the NCCL backend, but weft was built without CUDA "
             "(reconfigure with -Dcuda=enabled where the CUDA toolkit and NCCL are installed)", name);
}

int nccl_device_count() { return 0; }

}  // namespace weft::dist::detail

namespace weft::dist {
bool nccl_available() { return false; }
}  // namespace weft::dist
