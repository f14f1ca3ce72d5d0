// weft-bench: CPU kernel throughput against the machine's own measured peak. Prints one table: peak fp32 FMA rate per
// vector width (and the bf16 dot-product peak where the CPU has AVX512_BF16, the AMX tile peak where it has AMX),
// GFLOP/s of each f32 GEMM kernel the CPU runs (avx512, avx512_8x48, avx2, eigen; without a bf16 kernel also weft's own
// with bf16 operands) and of the bf16 ones at 1024^3 and the GEMM shapes of GPT training, of f32 and bf16 attention at
// GPT medium's, GPT-2 124M's and Llama 350M's shapes, and GB/s of an element-wise op, one read stream, a decode step's
// products and a row softmax, each at 1..N threads. Every figure is the median (and the best) of several runs after a
// warm-up.
#include <malloc.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "apps/bench/machine_peaks.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/nn.h"
#include "kernels/threads.h"

using namespace weft;
using namespace weft::bench;

namespace {

struct Row {
  std::string name, size, unit;
  std::vector<double> values;                 // one per thread count: the median run's rate
  const std::vector<double>* peak = nullptr;  // also print values as % of this peak (per thread count)
  std::vector<double> best;                   // the fastest run's rate
};

// The core clock from a chain of dependent integer adds (one per cycle), to read the peak as
// flops per cycle: 32 for two 256-bit FMA pipes (Zen 3, Zen 4), 64 for two 512-bit ones (Zen 5).
double clock_ghz() {
  uint64_t x = 0;
  const int64_t iters = 200'000'000;
  double t0 = seconds_now();
#ifdef __x86_64__
  for (int64_t i = 0; i < iters; ++i) asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
#endif
  return 4.0 * double(iters) / (seconds_now() - t0) / 1e9;
}

int print_table(const std::vector<Row>& rows, const std::vector<int>& counts, bool quick, int reps) {
  const double ghz = clock_ghz();
  std::printf("\ncore clock ~%.2f GHz (1 thread, dependent adds): the first peak row is %.0f flops per cycle\n", ghz,
              rows[0].values[0] / ghz);
  std::printf("\nweft-bench (%s): median (and best) of %d+ runs after warm-up; GEMM %% = share of the measured\n"
              "FMA peak of the kernel's instruction set, the best run of its rows (Eigen's: of the widest one;\n"
              "bf16: of the bf16 dot peak)\n\n", quick ? "quick" : "full", reps);
  std::string head = "| kernel | size |", rule = "|---|---|";
  for (int t : counts) {
    head += fmt::format(" {} thread{} |", t, t > 1 ? "s" : "");
    rule += "---:|";
  }
  std::printf("%s unit |\n%s---|\n", head.c_str(), rule.c_str());
  int above = 0;
  for (const Row& r : rows) {
    std::string line = fmt::format("| {} | {} |", r.name, r.size);
    for (size_t i = 0; i < r.values.size(); ++i) {
      if (r.peak)
        line += fmt::format(" {:.1f} ({:.0f}%), best {:.1f} ({:.0f}%) |", r.values[i], 100 * r.values[i] / (*r.peak)[i],
                            r.best[i], 100 * r.best[i] / (*r.peak)[i]);
      else line += fmt::format(" {:.1f} (best {:.1f}) |", r.values[i], r.best[i]);
      above += r.peak && r.values[i] > 1.02 * (*r.peak)[i];
    }
    std::printf("%s %s |\n", line.c_str(), r.unit.c_str());
  }
  if (above > 0)
    std::printf("\n%d GEMM figure(s) above their peak: the machine was busier while the peak rows ran (other "
                "processes); run again on a quiet one\n", above);
  return 0;
}

// What the rows share: the thread counts, the rows so far and the FMA peaks the GEMM rows are read against.
struct Bench {
  bool quick = false;
  int reps = 9;  // runs of a bandwidth row (3 with --quick)
  std::vector<int> counts;
  Generator gen{0};
  std::vector<Row> rows;
  std::map<std::string, std::vector<double>> peaks;  // by kernel name; rows point into it
  kernels::cpu::SgemmKernel default_kernel;
  std::vector<kernels::cpu::SgemmKernel> gemm_kernels;
  std::vector<kernels::cpu::BgemmKernel> bf16_kernels;
  std::string row_filter;  // --rows: only GEMM rows whose name holds it

  // Adds `row` with the rate `at_threads` gives at each thread count.
  void measure(Row row, const std::function<double(int)>& at_threads) {
    for (int t : counts) {
      set_num_threads(t);
      row.values.push_back(at_threads(t));
      row.best.push_back(row.values.back() * median_over_best);
    }
    rows.push_back(row);
    std::fprintf(stderr, "  measured %s %s\n", row.name.c_str(), row.size.c_str());
  }
  // Adds a row of the FMA peak of `isa` (fma_width's names).
  void measure_peak(const std::string& name, const std::string& isa) {
    measure({name, "-", "GFLOP/s", {}}, [&](int t) { return fma_gflops(isa, t, quick ? 20'000'000 : 50'000'000); });
  }
};

// 1, 2, 4, ... up to max_threads, and max_threads itself.
std::vector<int> thread_counts(int max_threads) {
  std::vector<int> counts;
  for (int t = 1; t <= max_threads; t *= 2) counts.push_back(t);
  if (counts.back() != max_threads) counts.push_back(max_threads);
  return counts;
}

// The FMA peak of each vector width the CPU has; a GEMM kernel is given as a share of the
// peak of its own instruction set (Eigen's: of the widest). Then the bf16 peaks where the bf16
// GEMM kernel runs (the CPU has AVX512_BF16, WEFT_CPU_GEMM allows it), choosing the bf16 rows.
void measure_peaks(Bench& b, const std::string& kernel_filter) {
  for (std::string isa : {"avx512", "avx2"}) {
    if (fma_width(isa) == 0) continue;
    b.measure_peak(fmt::format("peak fp32 FMA ({})", isa), isa);
    b.peaks[isa] = b.rows.back().best;  // a ceiling: its best run (a busy machine's slices slow the median)
    if (!b.peaks.count("eigen")) b.peaks["eigen"] = b.peaks[isa];
  }
  for (auto k : {kernels::cpu::BgemmKernel::amx, kernels::cpu::BgemmKernel::avx512bf16}) {
    const std::string name = kernels::cpu::bgemm_kernel_name(k);
    if (!kernels::cpu::bgemm_kernel_supported(k) || !(kernel_filter.empty() || kernel_filter == name)) continue;
    b.bf16_kernels.push_back(k);
    b.measure_peak(fmt::format("peak bf16 {} ({})", k == kernels::cpu::BgemmKernel::amx ? "tile" : "dot", name), name);
    b.peaks[name] = b.rows.back().best;
  }
}

// Each f32 GEMM kernel the CPU runs that --kernel selects (none when it names a bf16 one).
std::vector<kernels::cpu::SgemmKernel> f32_gemm_kernels(const std::string& kernel_filter) {
  std::vector<kernels::cpu::SgemmKernel> gemm_kernels;
  using kernels::cpu::SgemmKernel;
  for (auto k : {SgemmKernel::avx512, SgemmKernel::avx512_8x48, SgemmKernel::avx2, SgemmKernel::eigen})
    if (kernels::cpu::sgemm_kernel_supported(k) && (kernel_filter.empty() || kernel_filter == sgemm_kernel_name(k)))
      gemm_kernels.push_back(k);
  if (kernel_filter == "avx512bf16" || kernel_filter == "amx") gemm_kernels.clear();
  return gemm_kernels;
}

// The peak a GEMM kernel's rows are read against: its instruction set's (the 8 x 48 tile's is AVX-512's).
std::string peak_of(const std::string& kernel) { return kernel == "avx512_8x48" ? "avx512" : kernel; }

// C[m, n] = A[m, k] B[k, n]; a_t / b_t: the operand is a transposed view (as the backward
// pass's X^T and Linear's weight are), through each f32 GEMM kernel and each bf16 one: one row each.
void gemm_row(Bench& b, const std::string& name, int64_t m, int64_t k, int64_t n, bool a_t, bool b_t, int64_t batch,
              int r) {
  if (name.find(b.row_filter) == std::string::npos) return;
  Shape lead = batch > 1 ? Shape{batch} : Shape{};
  auto mat = [&](int64_t rows, int64_t cols, bool t, DType dt) {
    Shape s = lead;
    s.insert(s.end(), {t ? cols : rows, t ? rows : cols});
    Tensor x = randn(s, {}, &b.gen).to(dt);
    return t ? x.transpose(-1, -2) : x;
  };
  double flops = 2.0 * double(m) * double(n) * double(k) * double(batch);
  std::string size = (batch > 1 ? fmt::format("{}x[{}x{}x{}]", batch, m, k, n) : fmt::format("{}x{}x{}", m, k, n)) +
                     (a_t ? " A^T" : "") + (b_t ? " B^T" : "");
  auto time = [&](const std::string& kname, DType dt, const std::string& label) {
    Tensor x = mat(m, k, a_t, dt), y = mat(k, n, b_t, dt), out = empty({m, n}, {.dtype = dt});
    b.measure({fmt::format("{} ({})", name, label), size, "GFLOP/s", {}, &b.peaks[peak_of(kname)]}, [&](int) {
      double s = median_seconds(2, r, [&] {
        if (batch > 1) kernels::matmul(x, y);
        else kernels::gemm(x, false, y, false, out);
      });
      return flops / s / 1e9;
    });
  };
  for (auto kernel : b.gemm_kernels) {  // and where no bf16 kernel runs, bf16 operands on weft's own (widened)
    kernels::cpu::set_sgemm_kernel(kernel);
    const std::string kname = kernels::cpu::sgemm_kernel_name(kernel);
    time(kname, kFloat32, kname);
    if (!kernels::cpu::bf16_gemm_native() && kernel != kernels::cpu::SgemmKernel::eigen)
      time(kname, kBFloat16, kname + ", bf16 operands");
  }
  kernels::cpu::set_sgemm_kernel(b.default_kernel);
  const auto bf16_default =
      b.bf16_kernels.empty() ? kernels::cpu::BgemmKernel::avx512bf16 : kernels::cpu::bgemm_kernel();
  for (auto kernel : b.bf16_kernels) {  // bf16 in and out, f32 sums
    kernels::cpu::set_bgemm_kernel(kernel);
    time(kernels::cpu::bgemm_kernel_name(kernel), kBFloat16, kernels::cpu::bgemm_kernel_name(kernel));
  }
  if (!b.bf16_kernels.empty()) kernels::cpu::set_bgemm_kernel(bf16_default);
}

// Causal attention of a training step (batch B, ctx T, head dim E), q, k, v the heads of one fused qkv output: in f32
// on the f32 kernel in use (its register tiles, or the GEMM loops), and in bf16 on the bf16 kernel in use or, where the
// CPU has none, on the f32 path with bf16 operands; GFLOP/s as the op profiler counts them (forward 4 B H T^2 E,
// backward 10, halved).
void attention_row(Bench& b, const std::string& name, int64_t B, int64_t T, int64_t H, int64_t Hkv, double theta) {
  constexpr int64_t E = 64;  // the scale below is 1 / sqrt(E)
  if ((name + " attention").find(b.row_filter) == std::string::npos) return;
  const std::string size = fmt::format("B{} H{} Hkv{} T{} E{} causal{}", B, H, Hkv, T, E, theta ? " rope" : "");
  const std::string f32_kernel = kernels::cpu::sgemm_kernel_name(kernels::cpu::sgemm_kernel());
  const bool native = !b.bf16_kernels.empty();
  for (DType dt : {kFloat32, kBFloat16}) {
    if (b.gemm_kernels.empty() && !(dt == kBFloat16 && native)) continue;  // --kernel named a bf16 kernel
    Tensor x = randn({B, T, (H + 2 * Hkv) * E}, {}, &b.gen).to(dt);
    auto heads = [&](int64_t first, int64_t n) { return x.narrow(2, first * E, n * E).view({B, T, n, E}).transpose(1, 2); };
    Tensor q = heads(0, H), k = heads(H, Hkv), v = heads(H + Hkv, Hkv);
    const kernels::Rope rope{.theta = theta};
    auto [out, lse] = kernels::attention(q, k, v, true, 0.125, rope);
    Tensor grad = randn(out.shape(), {}, &b.gen).to(dt);
    const bool bf16_kernel = dt == kBFloat16 && native;
    const std::string kname = bf16_kernel ? kernels::cpu::bgemm_kernel_name(kernels::cpu::bgemm_kernel()) : f32_kernel;
    const std::string label = kname + (dt == kBFloat16 && !native ? ", bf16 operands" : "") +
                              (kernels::cpu::attention_uses_tiles(q, v) ? "" : ", GEMM loops");
    for (bool bwd : {false, true}) {
      const std::string row = fmt::format("{} attention {} ({})", name, bwd ? "bwd" : "fwd", label);
      b.measure({row, size, "GFLOP/s", {}, &b.peaks[bf16_kernel ? kname : peak_of(kname)]}, [&](int) {
        const double s = median_seconds(1, b.quick ? 3 : 9, [&] {
          if (bwd) kernels::attention_backward(grad, q, k, v, out, lse, true, 0.125, rope);
          else kernels::attention(q, k, v, true, 0.125, rope);
        });
        return (bwd ? 10 : 4) * double(B * H * T * T * E) / 2 / s / 1e9;
      });
    }
  }
}

void measure_gemms(Bench& b) {
  int gr = b.quick ? 5 : 15;  // repetitions of a GEMM
  gemm_row(b, "gemm", 1024, 1024, 1024, false, false, 1, gr);
  if (!b.quick) gemm_row(b, "gemm", 2048, 2048, 2048, false, false, 1, 5);
  // The models of scripts/bench_vs_pytorch.sh at 2,048 tokens (d_model C, the MLP's width F, q/k/v's
  // outputs QKV): a Linear's forward X W^T, and its backward dY W (dX) and dY^T X (dW).
  for (auto [tag, C, F, QKV] : {std::tuple{"GPT large", 512, 2048, 1536}, std::tuple{"GPT medium", 384, 1536, 1152},
                                std::tuple{"GPT small", 128, 512, 384}, std::tuple{"GPT-2 124M", 768, 3072, 2304},
                                std::tuple{"Llama 350M", 1024, 2816, 2048}}) {
    gemm_row(b, fmt::format("{} qkv fwd", tag), 2048, C, QKV, false, true, 1, gr);
    gemm_row(b, fmt::format("{} mlp fc fwd", tag), 2048, C, F, false, true, 1, gr);
    gemm_row(b, fmt::format("{} mlp proj fwd", tag), 2048, F, C, false, true, 1, gr);
    gemm_row(b, fmt::format("{} mlp proj dX", tag), 2048, C, F, false, false, 1, gr);
    gemm_row(b, fmt::format("{} mlp fc dW", tag), F, 2048, C, true, false, 1, gr);
  }
  gemm_row(b, "GPT-2 124M head fwd (8,192 of its columns)", 2048, 768, 8192, false, true, 1, b.quick ? 3 : 7);
  gemm_row(b, "Llama 350M head dW (all 50,257 rows)", 50257, 2048, 1024, true, false, 1, 2);
  gemm_row(b, "batched attention scores", 128, 64, 128, false, true, 48, b.quick ? 20 : 50);
  attention_row(b, "GPT medium", 8, 256, 6, 6, 0);
  attention_row(b, "GPT-2 124M", 2, 1024, 12, 12, 0);
  attention_row(b, "Llama 350M", 2, 1024, 16, 8, 10000);
}

// Bandwidth rows: bytes read + written per call.
void measure_bandwidth(Bench& b) {
  int64_t n = 4096 * 4096;
  Tensor x = randn({n}, {}, &b.gen), y = randn({n}, {}, &b.gen);
  b.measure({"add_ (a += b)", "16M f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, b.reps, [&] { kernels::add_(x, y); });
    return 3.0 * double(n) * 4 / s / 1e9;
  });
  // One stream read once, as a decode step reads its weights (add_ moves two reads and a write).
  b.measure({"one read stream (machine_peaks.h)", "64M f32", "GB/s", {}}, [&](int t) { return read_gbs(t); });
  // A decode step's products: one row times W^T, each W read once (16 of 8192 x 2048: past the last-level cache).
  for (DType dt : {kFloat32, kBFloat16}) {
    std::vector<Tensor> ws(16);
    for (Tensor& w : ws) w = full({8192, 2048}, 0.5, {.dtype = dt});  // the rate does not depend on the values
    Tensor x = randn({1, 2048}, {}, &b.gen).to(dt), out = empty({1, 8192}, {.dtype = dt});
    b.measure({fmt::format("decode product x W^T, W read ({})", dtype_name(dt)), "16 x 1x2048x8192", "GB/s", {}}, [&](int) {
      double s = median_seconds(1, b.reps, [&] { for (const Tensor& w : ws) kernels::gemm(x, false, w, true, out); });
      return 16.0 * double(ws[0].nbytes()) / s / 1e9;
    });
  }
  Tensor rows = randn({4096, 4096}, {}, &b.gen);
  b.measure({"softmax over rows", "4096x4096 f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, b.reps, [&] { kernels::softmax(rows, -1); });
    return 2.0 * double(n) * 4 / s / 1e9;
  });
  Tensor probs = randn({64 * 4 * 128, 128}, {}, &b.gen);  // attention probabilities: B*H*T rows of T
  b.measure({"softmax over rows", "32768x128 f32", "GB/s", {}}, [&](int) {
    double s = median_seconds(2, b.reps * 3, [&] { kernels::softmax(probs, -1); });
    return 2.0 * double(probs.numel()) * 4 / s / 1e9;
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft-bench: CPU kernel throughput (GEMM, element-wise, softmax) vs the measured peak"};
  Bench b;
  int max_threads = get_num_threads();
  app.add_flag("--quick", b.quick, "fewer repetitions and no 2048^3 GEMM");
  bool gemm_only = false;
  std::string kernel_filter;
  app.add_option("--threads", max_threads, "largest thread count to measure (1..N)")->check(CLI::Range(1, 1024));
  app.add_flag("--gemm-only", gemm_only, "only the FMA peak and the GEMM rows");
  app.add_option("--kernel", kernel_filter, "only this GEMM kernel (avx512bf16, amx: the bf16 ones)")
      ->check(CLI::IsMember({"avx512", "avx512_8x48", "avx2", "eigen", "avx512bf16", "amx"}));
  app.add_option("--rows", b.row_filter, "only the GEMM rows whose name holds this text (e.g. 'GPT-2 124M')");
  CLI11_PARSE(app, argc, argv);
  try {
    b.default_kernel = kernels::cpu::sgemm_kernel();  // WEFT_CPU_GEMM's, or the CPU's widest
  } catch (const Error& e) {
    std::fprintf(stderr, "weft-bench: %s\n", e.what());
    return 1;
  }
  // glibc maps every block over 32 MB afresh, so each 64 MB softmax output would pay ~16K
  // page faults (tens of ms under KVM) that have nothing to do with the kernel. Keep freed
  // blocks in the heap instead, as glibc already does for smaller ones.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);

  b.counts = thread_counts(max_threads);
  b.reps = b.quick ? 3 : 9;
  measure_peaks(b, kernel_filter);
  b.gemm_kernels = f32_gemm_kernels(kernel_filter);
  const size_t rows_before = b.rows.size();
  measure_gemms(b);
  if (b.rows.size() == rows_before)
    std::fprintf(stderr, "weft-bench: no GEMM rows: %s\n", b.gemm_kernels.empty() && b.bf16_kernels.empty()
                     ? ("this CPU cannot run --kernel " + kernel_filter).c_str()
                     : ("no row's name holds --rows '" + b.row_filter + "'").c_str());
  // The clock moves with load and temperature: the peak again after the GEMMs shows by how much.
  const std::string widest = fma_width("avx512") ? "avx512" : "avx2";
  if (fma_width(widest)) {
    b.measure_peak(fmt::format("peak fp32 FMA ({}), again", widest), widest);
    for (const std::string& k : {widest, std::string("eigen")})  // the rows read against the higher of the two
      for (size_t i = 0; i < b.counts.size(); ++i) b.peaks[k][i] = std::max(b.peaks[k][i], b.rows.back().best[i]);
  }
  if (!gemm_only) measure_bandwidth(b);
  return print_table(b.rows, b.counts, b.quick, b.reps);
}
