#include "kernels/threads.h"

#include "core/error.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace weft {

void set_num_threads(int n) {
  WEFT_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int get_num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace weft
