// The main of the multi-rank suites (test_dist_*): starts dist, runs Catch2 on every rank,
// and makes every rank exit non-zero if any rank had a failure, so mpirun's status and
// meson's verdict see a failure wherever it happened.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include "dist/dist.h"

int main(int argc, char** argv) {
  using namespace weft;
  // Suites registered with WEFT_TEST_GPUS=N need N GPUs per host: without them, every rank
  // says why and exits 77, which meson reports as SKIP.
  if (const char* need = std::getenv("WEFT_TEST_GPUS")) {
    int have = dist::cuda_device_count();
    if (!dist::nccl_available() || have < std::atoi(need)) {
      std::printf("SKIP: this suite needs %s CUDA GPU(s) per host and the NCCL backend; %s\n", need,
                  !dist::nccl_available() ? "weft was built without CUDA"
                                          : have == 0 ? "no CUDA device is visible" : "too few GPUs are visible");
      return 77;
    }
  }
  dist::init();
  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  int failed = session.run();
  Tensor verdict = from_vector({double(failed)}, {1}, {.dtype = kInt64});
  dist::world()->all_reduce(verdict, dist::ReduceOp::max)->wait();
  int worst = int(verdict.item());
  if (worst != 0)
    std::fprintf(stderr, "rank %d of %d: %d failed test cases here; a rank had %d\n", dist::rank(),
                 dist::world_size(), failed, worst);
  dist::finalize();
  return worst == 0 ? 0 : 1;
}
