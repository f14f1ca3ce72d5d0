// What the multi-rank suites (test_dist_*, test_fsdp_*) add to Catch2's own main (linked from
// libCatch2WithMain, not compiled here): a listener that starts dist before the first test case
// and, after the last, makes every rank exit non-zero if any rank had a failure, so mpirun's
// status and meson's verdict see a failure wherever it happened. Linked whole (tests/meson.build):
// nothing references the listener, its registration is a static initialiser.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "dist/dist.h"

namespace {

using namespace weft;

struct DistRun : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testRunStarting(const Catch::TestRunInfo& info) override {
    TestEventListenerBase::testRunStarting(info);
    // Suites registered with WEFT_TEST_GPUS=N need N GPUs per rank on each host: without them,
    // every rank says why and exits 77, which meson reports as SKIP (two ranks cannot share one
    // GPU in an NCCL communicator).
    dist::init();
    if (const char* need = std::getenv("WEFT_TEST_GPUS")) {
      const int have = dist::cuda_device_count(), want = std::atoi(need) * dist::local_size();
      if (!dist::nccl_available() || have < want) {
        std::printf("SKIP: this suite needs %s CUDA GPU(s) per rank (%d on this host) and the NCCL backend; %s\n",
                    need, want, !dist::nccl_available() ? "weft was built without CUDA"
                                : have == 0 ? "no CUDA device is visible"
                                            : fmt::format("{} GPU(s) are visible", have).c_str());
        std::fflush(stdout);
        dist::finalize();
        std::_Exit(77);
      }
    }
  }

  // Catch2's main returns this rank's failure count; a rank without failures of its own exits 1
  // here when another rank had some.
  void testRunEnded(const Catch::TestRunStats& stats) override {
    TestEventListenerBase::testRunEnded(stats);
    auto failed = stats.totals.testCases.failed;
    Tensor verdict = from_vector({double(failed)}, {1}, {.dtype = kInt64});
    dist::world()->all_reduce(verdict, dist::ReduceOp::max)->wait();
    int worst = int(verdict.item());
    if (worst != 0)
      std::fprintf(stderr, "rank %d of %d: %d failed test cases here; a rank had %d\n", dist::rank(),
                   dist::world_size(), int(failed), worst);
    dist::finalize();
    if (worst != 0 && failed == 0) {
      std::fflush(nullptr);
      std::exit(1);
    }
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(DistRun)
