// weft-bench: CPU kernel throughput against the machine's own measured peak. Prints one
// table: peak fp32 FMA rate, sgemm GFLOP/s at a few sizes (plus the GEMM shapes of an MLP
// layer and of attention), and GB/s of an element-wise op and of a row softmax, each at
// 1..N threads. Every figure is the median of several runs after a warm-up.
#include <malloc.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#ifdef __x86_64__
#include <immintrin.h>
#endif

#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/nn.h"
#include "kernels/threads.h"

using namespace weft;

namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median wall time of `reps` calls after `warmup` untimed ones.
double median_seconds(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = seconds_now();
    fn();
    t.push_back(seconds_now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Peak fp32 rate: 12 independent FMA chains per thread (more than latency x throughput,
// so the FMA pipes never wait), in the widest vectors the build targets.
const char* kFmaIsa =
#if defined(__AVX512F__)
    "AVX-512";
#elif defined(__FMA__)
    "AVX2+FMA";
#else
    "scalar";
#endif

double fma_gflops(int threads, int64_t iters) {
  double flops_per_thread = 0;
  volatile float sink = 0;
  double secs = median_seconds(1, 5, [&] {
#pragma omp parallel num_threads(threads)
    {
      float total = 0;
#if defined(__AVX512F__)
      __m512 acc[12], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
      for (auto& v : acc) v = _mm512_set1_ps(1.0f);
      for (int64_t i = 0; i < iters; ++i)
        for (auto& v : acc) v = _mm512_fmadd_ps(v, a, b);
      alignas(64) float lanes[16];
      for (auto& v : acc) {
        _mm512_store_ps(lanes, v);
        for (float l : lanes) total += l;
      }
      flops_per_thread = double(iters) * 12 * 16 * 2;
#elif defined(__FMA__)
      __m256 acc[12], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
      for (auto& v : acc) v = _mm256_set1_ps(1.0f);
      for (int64_t i = 0; i < iters; ++i)
        for (auto& v : acc) v = _mm256_fmadd_ps(v, a, b);
      alignas(32) float lanes[8];
      for (auto& v : acc) {
        _mm256_store_ps(lanes, v);
        for (float l : lanes) total += l;
      }
      flops_per_thread = double(iters) * 12 * 8 * 2;
#else
      float acc[12];
      for (auto& v : acc) v = 1.0f;
      for (int64_t i = 0; i < iters; ++i)
        for (auto& v : acc) v = v * 0.999999f + 1e-6f;
      for (float v : acc) total += v;
      flops_per_thread = double(iters) * 12 * 2;
#endif
      sink = sink + total;
    }
  });
  return flops_per_thread * threads / secs / 1e9;
}

struct Row {
  std::string name, size, unit;
  std::vector<double> values;     // one per thread count
  double peak_fraction_base = 0;  // > 0: also print values as % of this per-thread-count peak
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench: CPU kernel throughput (GEMM, element-wise, softmax) vs the measured peak"};
  bool quick = false;
  int max_threads = get_num_threads();
  app.add_flag("--quick", quick, "fewer repetitions and no 2048^3 GEMM");
  app.add_option("--threads", max_threads, "largest thread count to measure (1..N)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  // glibc maps every block over 32 MB afresh, so each 64 MB softmax output would pay ~16K
  // page faults (tens of ms under KVM) that have nothing to do with the kernel. Keep freed
  // blocks in the heap instead, as glibc already does for smaller ones.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  std::vector<int> counts;
  for (int t = 1; t <= max_threads; t *= 2) counts.push_back(t);
  if (counts.back() != max_threads) counts.push_back(max_threads);
  int reps = quick ? 3 : 9;
  Generator gen(0);
  std::vector<Row> rows;
  auto measure = [&](Row row, const std::function<double(int)>& at_threads) {
    for (int t : counts) {
      set_num_threads(t);
      row.values.push_back(at_threads(t));
    }
    rows.push_back(row);
    std::fprintf(stderr, "  measured %s %s\n", row.name.c_str(), row.size.c_str());
  };

  Row peak{fmt::format("peak fp32 FMA ({})", kFmaIsa), "-", "GFLOP/s", {}};
  measure(peak, [&](int t) { return fma_gflops(t, quick ? 20'000'000 : 50'000'000); });
  std::vector<double> peaks = rows.back().values;

  // C[m, n] = A[m, k] B[k, n]; a_t / b_t: the operand is a transposed view (as Linear's
  // weight and the backward pass's A^T are).
  auto gemm_row = [&](const char* name, int64_t m, int64_t k, int64_t n, bool b_t, int64_t batch, int r) {
    Tensor a = randn(batch > 1 ? Shape{batch, m, k} : Shape{m, k}, {}, &gen);
    Tensor b = b_t ? randn(batch > 1 ? Shape{batch, n, k} : Shape{n, k}, {}, &gen).transpose(-1, -2)
                   : randn(batch > 1 ? Shape{batch, k, n} : Shape{k, n}, {}, &gen);
    Tensor out = empty({m, n});
    double flops = 2.0 * double(m) * double(n) * double(k) * double(batch);
    std::string size =
        batch > 1 ? fmt::format("{}x[{}x{}x{}]", batch, m, k, n) : fmt::format("{}x{}x{}", m, k, n);
    measure({name, size + (b_t ? " (B^T view)" : ""), "GFLOP/s", {}, 1}, [&](int) {
      double s = median_seconds(2, r, [&] {
        if (batch > 1) kernels::matmul(a, b);
        else kernels::gemm(a, false, b, false, out);
      });
      return flops / s / 1e9;
    });
  };
  gemm_row("sgemm", 1024, 1024, 1024, false, 1, quick ? 5 : 15);
  if (!quick) gemm_row("sgemm", 2048, 2048, 2048, false, 1, 5);
  gemm_row("sgemm", 4096, 1024, 1024, false, 1, quick ? 3 : 7);
  gemm_row("linear fwd (MLP 784->512, batch 128)", 128, 784, 512, true, 1, quick ? 20 : 50);
  gemm_row("batched attention scores", 128, 64, 128, true, 48, quick ? 20 : 50);

  // Bandwidth rows: bytes read + written per call.
  int64_t n = 4096 * 4096;
  Tensor a = randn({n}, {}, &gen), b = randn({n}, {}, &gen);
  measure({"add_ (a += b)", "16M f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, reps, [&] { kernels::add_(a, b); });
    return 3.0 * double(n) * 4 / s / 1e9;
  });
  Tensor x = randn({4096, 4096}, {}, &gen);
  measure({"softmax over rows", "4096x4096 f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, reps, [&] { kernels::softmax(x, -1); });
    return 2.0 * double(n) * 4 / s / 1e9;
  });
  Tensor xs = randn({64 * 4 * 128, 128}, {}, &gen);  // attention probabilities: B*H*T rows of T
  measure({"softmax over rows", "32768x128 f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, reps * 3, [&] { kernels::softmax(xs, -1); });
    return 2.0 * double(xs.numel()) * 4 / s / 1e9;
  });

  std::printf(
      "\nweft-bench (%s): median of %d+ runs after warm-up; GEMM %% = share of the measured FMA peak\n\n",
      quick ? "quick" : "full", reps);
  std::string head = "| kernel | size |", rule = "|---|---|";
  for (int t : counts) {
    head += fmt::format(" {} thread{} |", t, t > 1 ? "s" : "");
    rule += "---:|";
  }
  std::printf("%s unit |\n%s---|\n", head.c_str(), rule.c_str());
  for (const Row& r : rows) {
    std::string line = fmt::format("| {} | {} |", r.name, r.size);
    for (size_t i = 0; i < r.values.size(); ++i) {
      if (r.peak_fraction_base > 0)
        line += fmt::format(" {:.1f} ({:.0f}%) |", r.values[i], 100 * r.values[i] / peaks[i]);
      else line += fmt::format(" {:.1f} |", r.values[i]);
    }
    std::printf("%s %s |\n", line.c_str(), r.unit.c_str());
  }
  return 0;
}
