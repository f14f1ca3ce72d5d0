// Ranks that disagree on purpose, for fault.sh: the job must fail on every rank with a message
// naming the collective, never hang.
// Usage: dist_fault skip|skip-nowait|mismatch|throw|fsdp-skip|fsdp-extra
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dist/agree.h"
#include "dist/dist.h"
#include "weft.h"

using namespace weft;
using namespace std::chrono_literals;

#ifdef WEFT_TEST_STUCK_ABORT
#include <mpi.h>
// A launcher that never answers MPI_Abort (built as dist_fault_stuck_abort): the executable's
// MPI_Abort takes the place of the MPI library's, so weft's abort path must end the process by
// itself.
extern "C" int MPI_Abort(MPI_Comm, int) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}
#endif

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "throw") {
    // An exception escapes on the last rank only, while the others wait in a collective: the
    // program's run_program must end the whole job at once, not after the collective timeout.
    return dist::run_program("dist_fault", [&] {
      dist::init();
      auto g = dist::world();
      int me = g->rank(), last = g->size() - 1;
      if (me == last) throw Error("rank " + std::to_string(me) + " fails on its own");
      Tensor out = empty({g->size() * 10});
      g->all_gather_into_tensor(out, ones({10}))->wait();
      std::fprintf(stderr, "rank %d: no error\n", me);
      return 2;
    });
  }
  if (mode == "fsdp-skip" || mode == "fsdp-extra") {
    // A sharded model trains one step on every rank. Then
    //   fsdp-skip:  the last rank does not run the second step: the others' first all-gather
    //               of it times out, and the report names the lagging rank and the module;
    //   fsdp-extra: the last rank gathers block 1 by hand before the second step: its call
    //               differs from the others' (the root's forward all-gather), which the
    //               fingerprint check reports on every rank before any buffer is touched.
    return dist::run_program("dist_fault", [&] {
      dist::init();
      int me = dist::rank(), last = dist::world_size() - 1;
      Generator gen(7);
      auto model = std::make_shared<nn::Sequential>();
      for (int i = 0; i < 3; ++i) model->push_back(std::make_shared<nn::Linear>(8, 8, true, &gen));
      for (size_t i = 0; i < model->size(); ++i) fsdp::fully_shard((*model)[i]);
      fsdp::fully_shard(model);
      Tensor x = randn({4, 8}, {}, &gen);
      sum((*model)(x)).backward();
      if (me == last) {
        if (mode == "fsdp-skip") {
          std::this_thread::sleep_for(60s);
          return 2;
        }
        fsdp::fsdp_module(*(*model)[1])->unshard();
      }
      sum((*model)(x)).backward();
      std::fprintf(stderr, "rank %d: no error\n", me);
      dist::finalize();
      return 2;
    });
  }
  dist::init();
  auto g = dist::world();
  int me = g->rank(), p = g->size(), last = p - 1;
  Tensor in = ones({1000}), out = empty({p * 1000});
  g->all_gather_into_tensor(out, in)->wait();  // #1: every rank
  if (mode == "skip") {
    // The last rank skips collective #2: the others' wait() times out and aborts the job.
    if (me != last) g->all_gather_into_tensor(out, in)->wait();
    else std::this_thread::sleep_for(60s);
  } else if (mode == "skip-nowait") {
    // As above, but nobody waits: the communication thread's watchdog must abort the job.
    if (me != last) {
      auto w = g->all_gather_into_tensor(out, in);
      auto end = std::chrono::steady_clock::now() + 60s;
      while (std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);  // "computing"
    } else {
      std::this_thread::sleep_for(60s);
    }
  } else if (mode == "mismatch") {
    // The last rank passes a different size; every rank must get the same error (from the
    // always-on fingerprint check, or with WEFT_DIST_DEBUG=1 from the full comparison).
    int64_t n = me == last ? 7 : 5;
    try {
      g->all_gather_into_tensor(empty({p * n}), ones({n}))->wait();
      std::fprintf(stderr, "rank %d: no error\n", me);
    } catch (const Error& e) {
      std::fprintf(stderr, "rank %d caught: %s\n", me, e.what());
      dist::finalize();
      return 3;
    }
  } else {
    std::fprintf(stderr, "usage: dist_fault skip|skip-nowait|mismatch|throw|fsdp-skip|fsdp-extra\n");
  }
  dist::finalize();
  return 2;  // reaching here means the fault went unnoticed
}
