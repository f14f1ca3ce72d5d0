// weft-bench-collectives: all-gather and reduce-scatter bandwidth through weft's MPI backend,
// beside the same collective on raw MPI in the same run, like nccl-tests. Run it under mpirun:
//   mpirun -np 4 --bind-to none ./weft-bench-collectives [--max-bytes 64M]
// size is the larger buffer (all-gather output, reduce-scatter input), as nccl-tests counts; algbw = size / time and
// busbw = algbw * (n - 1) / n, the bytes each rank's links carry. Each size runs in rounds that alternate the variants
// (raw blocking, raw nonblocking, weft), so a noisy machine slows them alike; the table gives each variant's best round
// (--stat median for the median): on a shared machine the best round is the one least disturbed.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "apps/common/cli.h"
#include "core/allocator.h"
#include "dist/dist.h"

using namespace weft;

namespace {

std::string human(int64_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{}M", bytes >> 20);
  if (bytes >= (1 << 10)) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

// Seconds per call of fn, timed over `iters` calls on every rank; the slowest rank counts.
double time_batch(const std::function<void()>& fn, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters, worst = 0;
  MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

double pick(std::vector<double> v, const std::string& stat) {
  std::sort(v.begin(), v.end());
  return stat == "min" ? v.front() : v[v.size() / 2];
}

struct Options {
  std::string min_s = "1K", max_s = "256M";
  int rounds = 9;
  std::string stat = "min";
  double batch_ms = 50;
};

void print_section_head(bool gather) {
  std::printf("\n## %s (size = %s bytes)\n", gather ? "all-gather" : "reduce-scatter (sum)",
              gather ? "output" : "input");
  std::printf("%9s %11s | %-29s | %-29s | %-29s | %8s %8s\n", "", "",
              gather ? "MPI_Allgather" : "MPI_Reduce_scatter_block",
              gather ? "MPI_Iallgather + MPI_Wait" : "MPI_Ireduce_scatter_block+Wait",
              gather ? "weft all_gather_into_tensor" : "weft reduce_scatter_tensor", "weft vs", "weft vs");
  std::printf("%9s %11s | %9s %9s %9s | %9s %9s %9s | %9s %9s %9s | %8s %8s\n", "size", "count/rank", "time(us)",
              "algbw", "busbw", "time(us)", "algbw", "busbw", "time(us)", "algbw", "busbw", "blocking", "nonblk");
}

// One row of the table: the all-gather (or reduce-scatter) of `bytes` in all, each variant timed in alternating rounds.
void bench_size(const Options& o, bool gather, int64_t bytes, dist::ProcessGroup& world, MPI_Comm comm) {
  const int n = world.size();
  int64_t per_rank = std::max<int64_t>(1, bytes / 4 / n), total = per_rank * n;
  Tensor small = full({per_rank}, 1.0), big = full({total}, 1.0);
  int count = int(per_rank);
  std::function<void()> raw, raw_nb, ours;
  if (gather) {
    raw = [&] { MPI_Allgather(small.data_ptr(), count, MPI_FLOAT, big.data_ptr(), count, MPI_FLOAT, comm); };
    raw_nb = [&] {
      MPI_Request r;
      MPI_Iallgather(small.data_ptr(), count, MPI_FLOAT, big.data_ptr(), count, MPI_FLOAT, comm, &r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    };
    ours = [&] { world.all_gather_into_tensor(big, small)->wait(); };
  } else {
    raw = [&] { MPI_Reduce_scatter_block(big.data_ptr(), small.data_ptr(), count, MPI_FLOAT, MPI_SUM, comm); };
    raw_nb = [&] {
      MPI_Request r;
      MPI_Ireduce_scatter_block(big.data_ptr(), small.data_ptr(), count, MPI_FLOAT, MPI_SUM, comm, &r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    };
    ours = [&] { world.reduce_scatter_tensor(small, big)->wait(); };
  }
  // Warm up (first-touch, MPI's buffers), then size the batches from the slowest variant.
  double probe = std::max({time_batch(raw, 1), time_batch(raw_nb, 1), time_batch(ours, 1)});
  int iters = std::clamp(int(o.batch_ms * 1e-3 / std::max(probe, 1e-7)), 1, 2000);
  std::vector<double> t_raw, t_nb, t_ours;
  for (int r = 0; r < o.rounds; ++r) {
    t_raw.push_back(time_batch(raw, iters));
    t_nb.push_back(time_batch(raw_nb, iters));
    t_ours.push_back(time_batch(ours, iters));
  }
  if (world.rank() != 0) return;
  double bus = double(n - 1) / n, b = double(total) * 4;
  auto cols = [&](double t) { return fmt::format("{:9.1f} {:9.3f} {:9.3f}", t * 1e6, b / t / 1e9, b / t / 1e9 * bus); };
  double a = pick(t_raw, o.stat), nb = pick(t_nb, o.stat), w = pick(t_ours, o.stat);
  std::printf("%9s %11lld | %s | %s | %s | %+7.1f%% %+7.1f%%\n", human(int64_t(b)).c_str(), (long long)per_rank,
              cols(a).c_str(), cols(nb).c_str(), cols(w).c_str(), (w / a - 1) * 100, (w / nb - 1) * 100);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench-collectives: all-gather and reduce-scatter through weft vs raw MPI (run under mpirun)"};
  Options o;
  app.add_option("--min-bytes", o.min_s, "smallest size (K, M, G suffixes; each size is rounded down to whole f32s a rank, at least one, and the table shows the size measured)")->check(apps::cli::bytes())->capture_default_str();
  app.add_option("--max-bytes", o.max_s, "largest size; sizes grow 4x from --min-bytes")->check(apps::cli::bytes())
      ->capture_default_str();
  app.add_option("--rounds", o.rounds, "alternating rounds per size")->check(apps::cli::integer(1, 1000))->capture_default_str();
  app.add_option("--stat", o.stat, "which round to report: min (least disturbed) or median")
      ->check(CLI::IsMember({"min", "median"}))
      ->capture_default_str();
  app.add_option("--batch-ms", o.batch_ms, "target time of one round's batch of calls")
      ->check(apps::cli::number_from(0.001, 1e6))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const int64_t min_bytes = parse_bytes(o.min_s, "--min-bytes"), max_bytes = parse_bytes(o.max_s, "--max-bytes");
  if (min_bytes < 4 || max_bytes < min_bytes) {
    std::fprintf(stderr, "weft-bench-collectives: --min-bytes %s and --max-bytes %s: need 4 B (one f32) <= min <= max\n",
                 o.min_s.c_str(), o.max_s.c_str());
    return 2;
  }

  dist::init();
  auto world = dist::world();
  int n = world->size(), me = world->rank();
  MPI_Comm comm;  // raw MPI gets its own communicator too, as weft's world group has
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  if (me == 0) {
    char host[MPI_MAX_PROCESSOR_NAME];
    int len = 0;
    MPI_Get_processor_name(host, &len);
    std::printf("# weft-bench-collectives: %d ranks on %s, f32, %s of %d rounds per size, sizes %s..%s\n", n, host,
                o.stat == "min" ? "best" : "median", o.rounds, human(min_bytes).c_str(), human(max_bytes).c_str());
  }
  try {
    for (bool gather : {true, false}) {
      if (me == 0) print_section_head(gather);
      for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) bench_size(o, gather, bytes, *world, comm);
    }
  } catch (const std::exception& e) {  // out of memory at the largest sizes, say: the other ranks wait in MPI
    dist::abort_job(fmt::format("weft-bench-collectives: error on rank {}: {}", me, e.what()));
  }
  if (me == 0)
    std::printf("\nalgbw and busbw in GB/s; times are per call, the %s of %d rounds.\n",
                o.stat == "min" ? "best" : "median", o.rounds);
  MPI_Comm_free(&comm);
  dist::finalize();
  return 0;
}
