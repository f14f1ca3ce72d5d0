// apps/bench: this machine's own limits, measured, for benchmarks to read their rates against:
// the FMA peak of each vector instruction set, the bf16 dot-product and AMX tile peaks, and
// the memory bandwidth of a streaming loop and of one read stream. Each is a median of runs after a warm-up.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace weft::bench {

double seconds_now();
// Median wall time of `reps` calls after `warmup` untimed ones; median_over_best is then the
// median's ratio to the fastest call (turns a median rate into the best one).
double median_seconds(int warmup, int reps, const std::function<void()>& fn);
extern double median_over_best;

// Vector width of `isa`'s peak loop ("avx512", "avx2": fp32 lanes; "avx512bf16": products per
// instruction; "amx": per tile product); 0 where the CPU lacks it.
int fma_width(const std::string& isa);
// GFLOP/s of `threads` threads running `isa`'s peak loop for `iters` steps each.
double fma_gflops(const std::string& isa, int threads, int64_t iters);
// The compute peak a GEMM in `dtype_name` ("f32", "bf16") reaches through weft's own kernels
// here (bf16: the AMX tile peak, else the bf16 dot peak; f32: the widest FMA peak); 0 if none.
double gemm_peak_gflops(const std::string& dtype_name, int threads);
// GB/s (read + written) of a[i] = b[i] + s * c[i] over arrays far larger than the caches.
double stream_gbs(int threads);
// GB/s read by summing one array far larger than the caches (a decode step reads its weights so).
double read_gbs(int threads);

}  // namespace weft::bench
