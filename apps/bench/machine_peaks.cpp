// apps/bench: the measured peaks and bandwidth of this machine (apps/bench/machine_peaks.h).
#include "apps/bench/machine_peaks.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#ifdef __x86_64__
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/gemm.h"

namespace weft::bench {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_over_best = 1;

double median_seconds(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    double t0 = seconds_now();
    fn();
    t.push_back(seconds_now() - t0);
  }
  std::sort(t.begin(), t.end());
  median_over_best = t[t.size() / 2] / t[0];
  return t[t.size() / 2];
}

// Peak fp32 rate of one instruction set: 12 independent FMA chains per thread (more than
// latency x throughput, so the FMA pipes never wait). Each loop is compiled for its own set and
// run only where the CPU has it, whatever the build flags, so the peak is the CPU's, not the
// build's. Counted per thread that actually ran: OpenMP may start fewer than asked.
#ifdef __x86_64__
// The sum of every lane of the chains (kept, so the loops are not optimised away).
template <class V, size_t N>
float lane_total(const V (&acc)[N]) {
  float total = 0, lanes[sizeof(V) / sizeof(float)];
  for (const V& v : acc) {
    std::memcpy(lanes, &v, sizeof(V));
    for (float l : lanes) total += l;
  }
  return total;
}
__attribute__((target("avx512f"))) float chains_avx512(int64_t iters) {
  __m512 acc[12], a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
  for (auto& v : acc) v = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm512_fmadd_ps(v, a, b);
  return lane_total(acc);
}
__attribute__((target("avx2,fma"))) float chains_avx2(int64_t iters) {
  __m256 acc[12], a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
  for (auto& v : acc) v = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i)
    for (auto& v : acc) v = _mm256_fmadd_ps(v, a, b);
  return lane_total(acc);
}
// The bf16 dot peak: 12 x iters vdpbf16ps (64 flops each) over 24 chains in registers, each from its own
// value (equal chains fold into one); 12 chains reach 89 % of a Zen 5's 128 flops per cycle, 24 all of it.
__attribute__((target("avx512f,avx512bf16"))) float chains_avx512bf16(int64_t iters) {
  __m512 acc[24];
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (int j = 0; j < 24; ++j) acc[j] = _mm512_set1_ps(1.0f + float(j));
  for (int64_t i = 0; i < iters / 2; ++i)
#pragma GCC unroll 24
    for (int j = 0; j < 24; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], a, a);
  return lane_total(acc);
}
// AMX's bf16 peak: 4 chains of tdpbf16ps (16 x 16 f32 sums of 32 products each: 16,384 flops)
// on one pair of tiles; the kernel's own choice has asked Linux for the tile state.
__attribute__((target("amx-tile,amx-bf16"))) float chains_amx(int64_t iters) {
  struct alignas(64) {
    uint8_t palette = 1, start = 0, reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
  } config;
  alignas(64) uint16_t ones[16 * 32];
  alignas(64) float out[16 * 16];
  std::fill(std::begin(ones), std::end(ones), uint16_t(0x3a83));  // 1e-3 in bf16
  _tile_loadconfig(&config);
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, out, 64);
  asm volatile("" ::: "memory");
  _tile_release();
  return out[0];
}
#endif

// Vector width in floats of the FMA loop for `isa` ("avx512", "avx2"); 0 where the CPU lacks it.
int fma_width(const std::string& isa) {
#ifdef __x86_64__
  if (isa == "avx512" && __builtin_cpu_supports("avx512f")) return 16;
  if (isa == "avx2" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
  if (isa == "avx512bf16" && __builtin_cpu_supports("avx512bf16")) return 32;  // bf16 pairs: 32 products
  if (isa == "amx" && kernels::cpu::bgemm_kernel_supported(kernels::cpu::BgemmKernel::amx)) return 16 * 16 * 32;
#endif
  return 0;
}

double fma_gflops(const std::string& isa, int threads, int64_t iters) {
  int ran = 1, width = fma_width(isa);
  const bool amx = isa == "amx";
  if (amx) iters /= 64;  // each step of its chains does 85 times vdpbf16ps's work
  volatile float sink = 0;
  double secs = median_seconds(1, 5, [&] {
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
#pragma omp single
      ran = omp_get_num_threads();
#endif
#ifdef __x86_64__
      float total = amx                   ? chains_amx(iters)
                    : isa == "avx512bf16" ? chains_avx512bf16(iters)
                    : width == 16         ? chains_avx512(iters)
                                          : chains_avx2(iters);
#pragma omp critical
      sink = sink + total;
#endif
    }
  });
  return double(iters) * (amx ? 4 : 12) * width * 2 * ran / secs / 1e9;
}

double gemm_peak_gflops(const std::string& dtype_name, int threads) {
  const int64_t iters = 20'000'000;
  if (dtype_name == "bf16") {
    if (kernels::cpu::bgemm_kernel_supported(kernels::cpu::BgemmKernel::amx)) return fma_gflops("amx", threads, iters);
    return fma_width("avx512bf16") ? fma_gflops("avx512bf16", threads, iters) : 0.0;
  }
  if (dtype_name != "f32") return 0;
  return fma_width("avx512") ? fma_gflops("avx512", threads, iters)
         : fma_width("avx2") ? fma_gflops("avx2", threads, iters) : 0.0;
}

double stream_gbs(int threads) {
  const int64_t n = int64_t(1) << 25;  // 128 MiB per array
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  const double secs = median_seconds(1, 5, [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
  });
  return 3.0 * double(n) * sizeof(float) / secs / 1e9;
}

double read_gbs(int threads) {
  const int64_t n = int64_t(1) << 26;  // 256 MiB
  std::vector<float> a(n, 1.0f);
  [[maybe_unused]] static volatile float kept;  // the total is stored, so no load is dropped
  const double secs = median_seconds(1, 5, [&] {
    float total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (int64_t b = 0; b < n; b += 4096) {
      float part[64] = {};  // 64 independent lanes: vector adds in several chains
      for (int64_t i = b; i < b + 4096; i += 64) for (int l = 0; l < 64; ++l) part[l] += a[i + l];
      for (float v : part) total += v;
    }
    kept = total;
  });
  return double(n) * sizeof(float) / secs / 1e9;
}

}  // namespace weft::bench
