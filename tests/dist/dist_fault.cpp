// Ranks that disagree on purpose, for fault.sh: the job must fail on every rank with a message
// naming the collective, never hang. Usage: dist_fault skip|skip-nowait|mismatch|throw
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "dist/agree.h"
#include "dist/dist.h"

using namespace weft;
using namespace std::chrono_literals;

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
    // Run with WEFT_DIST_DEBUG=1: the last rank passes a different size; every rank must
    // get the same error.
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
    std::fprintf(stderr, "usage: dist_fault skip|skip-nowait|mismatch|throw\n");
  }
  dist::finalize();
  return 2;  // reaching here means the fault went unnoticed
}
