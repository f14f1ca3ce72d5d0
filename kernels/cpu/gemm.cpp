// kernels/cpu: matrix products, f32 through weft's own kernels (sgemm.h) where the CPU has
// AVX2 + FMA or AVX-512, f64 (and f32 elsewhere) through Eigen. A large GEMM is split into
// slices of the output over the OpenMP threads (see gemm below); inside a parallel region they
// run on the calling thread, which is what lets batched matmul split small GEMMs across the batch.
#include "kernels/cpu/gemm.h"

// Eigen never threads a product itself: split_product below does, in slices whose bits do not
// depend on the thread count (Eigen's own split, and its blocking for it, do).
#define EIGEN_DONT_PARALLELIZE
// gcc 12 reports false "may be used uninitialized" warnings inside its own AVX-512
// intrinsics once Eigen's packet code is inlined; silence them for Eigen only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>
#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/copy.h"
#include "core/dispatch.h"
#include "core/error.h"
#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/elementwise.h"  // reduction_chunks
#include "kernels/cpu/gemm_scratch.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/threads.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace weft::kernels::cpu {
namespace {

using Eigen::Dynamic;
using Eigen::OuterStride;

template <typename T, int Order>
using ConstMat = Eigen::Map<const Eigen::Matrix<T, Dynamic, Dynamic, Order>, 0, OuterStride<>>;
template <typename T>
using OutMat = Eigen::Map<Eigen::Matrix<T, Dynamic, Dynamic, Eigen::RowMajor>, 0, OuterStride<>>;

template <typename T, int OrderA, int OrderB>
void gemm_eigen(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
                int64_t ldc, T alpha, T beta) {
  ConstMat<T, OrderA> A(a, m, k, OuterStride<>(lda));
  ConstMat<T, OrderB> B(b, k, n, OuterStride<>(ldb));
  OutMat<T> C(c, m, n, OuterStride<>(ldc));
  if (beta == T(0)) {
    if (alpha == T(1)) C.noalias() = A * B;
    else C.noalias() = alpha * A * B;
  } else {
    if (beta != T(1)) C *= beta;
    C.noalias() += alpha * A * B;
  }
}

// Per-matrix element offsets of `t` ([..., r, c]) for each index of `batch` (broadcasting).
std::vector<int64_t> batch_offsets(const Tensor& t, const Shape& batch) {
  int64_t nb = shape_numel(batch), nd = int64_t(batch.size()), lead = nd - (t.dim() - 2);
  Shape strides(nd, 0);
  for (int64_t d = lead; d < nd; ++d)
    if (t.size(d - lead) != 1) strides[d] = t.stride(d - lead);
  std::vector<int64_t> offs(nb);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t rem = i, off = 0;
    for (int64_t d = nd - 1; d >= 0; --d) {
      off += (rem % batch[d]) * strides[d];
      rem /= batch[d];
    }
    offs[i] = off;
  }
  return offs;
}

Tensor with_layout(const Tensor& t) { return mat_layout(t).ok ? t : t.contiguous(); }

// Row r of a, column j of b, in their layouts.
template <typename T> const T* row_at(const T* a, MatLayout l, int64_t r) { return l.row_major ? a + r * l.ld : a + r; }
template <typename T> const T* col_at(const T* b, MatLayout l, int64_t j) { return l.row_major ? b + j : b + j * l.ld; }

// dst[l * len + e] = x[l * ld + e] in f32, for `lines` lines of `len`; with `sums`, each
// line's sum (lines_are_rows) or each position's sum over the lines is added to it, in f64.
template <typename T>
void widen_lines(const T* x, int64_t ld, int64_t lines, int64_t len, float* dst, double* sums, bool lines_are_rows) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && lines * len >= (1 << 16) && !(sums && !lines_are_rows))
  for (int64_t l = 0; l < lines; ++l) {
    double s = 0;
    for (int64_t e = 0; e < len; ++e) {
      dst[l * len + e] = float(x[l * ld + e]);
      if (sums) lines_are_rows ? void(s += dst[l * len + e]) : void(sums[e] += dst[l * len + e]);
    }
    if (sums && lines_are_rows) sums[l] += s;
  }
}

// 16-bit operands where no bf16 kernel takes them (CPUs without AVX512_BF16, f16): the f32 kernels on f32 copies of
// blocks of a (whole rows) and b (whole columns) of at most kWidenedBlock elements, and of c's block when c is 16-bit,
// in buffers of the thread that stay that size however large the operands (as the kernels' packing buffers do): a step
// then allocates no more than with the bf16 kernels, which is what fsdp::plan_memory predicts. Each element of c gets
// the bits that f32 copies of the whole operands would give (the f32 kernels' bits do not depend on where a block
// starts); c is rounded once. a_sums (m of them), when given, receive a's row sums.
constexpr int64_t kWidenedBlock = int64_t(1) << 20;

template <typename T, typename TO>
void gemv_widened(int64_t n, int64_t k, const T* x, const T* w, MatLayout lw, TO* c, float alpha, float beta,
                  double* x_sum);
template <typename TO>
bool gemm_bf16_packing(int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b,
                       MatLayout lb, TO* c, int64_t ldc, float alpha, float beta, const TO* bias, double* a_sums);

// f(pc, ldpc, beta) on c's [rows, cols] block: c itself when TO is f32, else the thread's f32 copy of it (read only
// when beta != 0), rounded back once. With a bias (beta 0) the block starts as the bias rows and f adds onto them
// (beta 1): the bits of filling c with the bias first, without a pass that reads 16-bit c back.
template <typename TO, class F>
void through_f32(TO* c, int64_t ldc, int64_t rows, int64_t cols, float beta, const TO* bias, F&& f) {
  float* pc = nullptr;
  int64_t ldpc = cols;
  if constexpr (std::is_same_v<TO, float>) {
    pc = c, ldpc = ldc;
  } else {
    static thread_local Scratch<float> c_buf;
    pc = c_buf.get(rows * cols);
    for (int64_t i = 0; i < rows && beta != 0.0f; ++i)
      for (int64_t j = 0; j < cols; ++j) pc[i * cols + j] = float(c[i * ldc + j]);
  }
  for (int64_t i = 0; i < rows && bias; ++i)
    for (int64_t j = 0; j < cols; ++j) pc[i * ldpc + j] = float(bias[j]);
  f(pc, ldpc, bias ? 1.0f : beta);
  if constexpr (!std::is_same_v<TO, float>)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) c[i * ldc + j] = convert_scalar<TO>(pc[i * cols + j]);
}

template <typename T, typename TO>
void gemm_widened(int64_t m, int64_t n, int64_t k, const T* a, MatLayout la, const T* b, MatLayout lb, TO* c,
                  int64_t ldc, float alpha, float beta, const TO* bias = nullptr, double* a_sums = nullptr) {
  if (m == 1 && la.row_major && !lb.row_major) {
    if (bias) std::copy_n(bias, n, c), beta = 1.0f;
    return gemv_widened(n, k, a, b, lb, c, alpha, beta, a_sums);
  }
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (gemm_bf16_packing(m, n, k, a, la, b, lb, c, ldc, alpha, beta, bias, a_sums)) return;
  }
  static thread_local Scratch<float> a_buf, b_buf;
  const int64_t nb = std::clamp<int64_t>(kWidenedBlock / std::max<int64_t>(k, 1), 1, std::max<int64_t>(n, 1));
  const int64_t mb = std::clamp<int64_t>(kWidenedBlock / std::max(k, nb), 1, std::max<int64_t>(m, 1));
  if (a_sums) std::fill_n(a_sums, m, 0.0);
  for (int64_t j0 = 0; j0 < n; j0 += nb) {
    const int64_t nc = std::min(nb, n - j0);
    float* pb = b_buf.get(nc * k);
    widen_lines(col_at(b, lb, j0), lb.ld, lb.row_major ? k : nc, lb.row_major ? nc : k, pb, nullptr, false);
    const MatLayout wb{true, lb.row_major, lb.row_major ? nc : k};
    for (int64_t i0 = 0; i0 < m; i0 += mb) {
      const int64_t mc = std::min(mb, m - i0);
      float* pa = a_buf.get(mc * k);
      double* sums = a_sums && j0 == 0 ? a_sums + i0 : nullptr;
      widen_lines(row_at(a, la, i0), la.ld, la.row_major ? mc : k, la.row_major ? k : mc, pa, sums, la.row_major);
      const MatLayout wa{true, la.row_major, la.row_major ? k : mc};
      through_f32(c + i0 * ldc + j0, ldc, mc, nc, beta, bias ? bias + j0 : nullptr, [&](float* pc, int64_t ldpc, float bt) {
        gemm<float>(mc, nc, k, pa, wa, pb, wb, pc, ldpc, alpha, bt);
      });
    }
  }
}

// One product (split over threads as gemm does): T inputs; bf16 ones take the bf16 kernel
// where the CPU has it, other 16-bit ones the f32 kernels on widened blocks.
template <typename T, typename TO>
void product(int64_t m, int64_t n, int64_t k, const T* a, MatLayout la, const T* b, MatLayout lb, TO* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    if (bf16_gemm_native()) return gemm_bf16<TO>(m, n, k, a, la, b, lb, c, ldc);
  }
  if constexpr (std::is_same_v<T, acc_t<T>>) gemm<T>(m, n, k, a, la, b, lb, c, ldc);
  else gemm_widened<T, TO>(m, n, k, a, la, b, lb, c, ldc, 1.0f, 0.0f);
}

template <typename T, typename TO = T>
void matmul_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  TO* c = out.data<TO>();
  if (a.dim() == 2 && b.dim() == 2) {
    Tensor A = with_layout(a), B = with_layout(b);
    product<T, TO>(m, n, k, A.data<T>(), mat_layout(A), B.data<T>(), mat_layout(B), c, n);
    return;
  }
  if (b.dim() == 2) {  // [..., m, k] @ [k, n]: one GEMM over all rows (a Linear layer)
    if (auto la = fold_rows(a)) {
      Tensor B = with_layout(b);
      product<T, TO>(a.numel() / std::max<int64_t>(k, 1), n, k, a.data<T>(), *la, B.data<T>(), mat_layout(B), c, n);
      return;
    }
  }
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  int64_t nb = shape_numel(batch);
  // Copies are made before broadcasting, so a shared operand is copied once.
  Tensor A = with_layout(a), B = with_layout(b);
  MatLayout la = mat_layout(A), lb = mat_layout(B);
  std::vector<int64_t> oa = batch_offsets(A, batch), ob = batch_offsets(B, batch);
  const T* pa = A.data<T>();
  const T* pb = B.data<T>();
  double work = double(m) * double(n) * double(k);
  int threads = get_num_threads();
  auto one = [&](int64_t i) { product<T, TO>(m, n, k, pa + oa[i], la, pb + ob[i], lb, c + i * m * n, n); };
  // Small GEMMs do not pay for threading inside one product; a batch split does, once every thread gets a whole GEMM.
  // Otherwise run in turn, outside any parallel region, so that each GEMM is threaded.
  if (threads > 1 && nb >= threads && work * nb > 1e5 && (work < double(1 << 22) || nb >= 4 * threads)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nb; ++i) one(i);
  } else {
    for (int64_t i = 0; i < nb; ++i) one(i);
  }
}

}  // namespace

std::optional<MatLayout> fold_rows(const Tensor& a) {
  int64_t k = a.size(-1), rows = a.numel() / std::max<int64_t>(k, 1);
  if (k > 1 && a.stride(-1) != 1) return std::nullopt;
  int64_t row_stride = -1, expected = 0;
  for (int64_t d = a.dim() - 2; d >= 0; --d) {
    if (a.size(d) == 1) continue;
    if (row_stride < 0) {
      row_stride = a.stride(d);
      expected = row_stride * a.size(d);
    } else if (a.stride(d) != expected) {
      return std::nullopt;
    } else {
      expected *= a.size(d);
    }
  }
  if (rows <= 1) return row_major(std::max<int64_t>(k, 1));
  if (row_stride < k) return std::nullopt;  // broadcast (stride 0) or overlapping rows
  return row_major(row_stride);
}

MatLayout mat_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  if (rows <= 1 && cols <= 1) return row_major(1);
  if ((col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols))
    return row_major(rows == 1 ? cols : row_stride);
  if ((row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows))
    return col_major(cols == 1 ? rows : col_stride);
  return {};
}

namespace {

// The kernel environment variable `var` names among `all` (those `supported` on this CPU, by
// `name`), else the first this CPU runs in the order it prefers them (`order`, `all` reordered); a bad value leaves an
// error for `in_use` to report, listing `all` in their own order.
template <class K, size_t N, class Supported, class Name>
std::pair<K, std::string> choose_kernel(const char* var, const K (&all)[N], const K (&order)[N], Supported supported,
                                        Name name) {
  const char* env = std::getenv(var);
  const bool set = env && *env;
  for (K k : order)
    if (supported(k) && (!set || std::strcmp(env, name(k)) == 0)) return {k, ""};
  std::string here, allowed;
  for (K k : all) {
    allowed += std::string(allowed.empty() ? "" : ", ") + name(k);
    if (supported(k)) here += std::string(here.empty() ? "" : ", ") + name(k);
  }
  return {all[N - 1], fmt::format("{}={}: not a kernel this CPU runs; allowed values: {} (this CPU: {})", var,
                                  set ? env : "", allowed, here)};
}

// The chosen kernel, or the one a test forced. The error is thrown only outside a parallel region (inside, an exception
// would end the program): the first product outside one, e.g. every Linear layer's, reports it.
template <class K>
K in_use(const std::pair<K, std::string>& chosen, const std::atomic<int>& forced) {
  if (int f = forced.load(std::memory_order_relaxed); f >= 0) return K(f);
#ifdef _OPENMP
  if (!chosen.second.empty() && !omp_in_parallel()) WEFT_ERROR("{}", chosen.second);
#else
  if (!chosen.second.empty()) WEFT_ERROR("{}", chosen.second);
#endif
  return chosen.first;
}

// In the order a CPU of each vendor prefers them: the 8 x 48 tile is the faster on Intel (sgemm_avx512.cpp).
using SK = SgemmKernel;
constexpr SK kAllSgemm[] = {SK::avx512, SK::avx512_8x48, SK::avx2, SK::eigen};
constexpr SK kIntelSgemm[] = {SK::avx512_8x48, SK::avx512, SK::avx2, SK::eigen};
constexpr BgemmKernel kAllBgemm[] = {BgemmKernel::amx, BgemmKernel::avx512bf16};

std::atomic<int> forced_sgemm{-1}, forced_bgemm{-1};  // set_sgemm_kernel, set_bgemm_kernel

// weft's own f32 kernel behind `k`, its bf16-operand entry and its register tile (rows of a, columns of b); null
// functions for Eigen.
struct OwnKernel {
  SgemmFn f32 = nullptr;
  SgemmBf16Fn bf16 = nullptr;
  int64_t rows = 12, cols = 32;
};
OwnKernel own_kernel(SgemmKernel k) {
#ifdef __x86_64__
  if (k == SgemmKernel::avx512) return {sgemm_avx512, sgemm_avx512_bf16, 12, 32};
  if (k == SgemmKernel::avx512_8x48) return {sgemm_avx512_8x48, sgemm_avx512_8x48_bf16, 8, 48};
  if (k == SgemmKernel::avx2) return {sgemm_avx2, sgemm_avx2_bf16, 6, 32};
#endif
  return {};
}

// c[j] = alpha * (x . w_j) + beta * c[j], w_j = w + j * ldw (j < n): x W^T, a Linear's one-token
// step. Reading w front to back, a row at a time, instead of Eigen's GEMV, which interleaves four
// rows: 1.6-1.7x the decode tokens/s of weft-bench-generate on Zen 4 (docs/PERFORMANCE.md).
// 16-bit w and c (TW, TC) are widened element by element as they are read and c rounded once:
// the bits of T copies of w and c, at the bytes of the 16-bit weights (a bf16 decode step).
template <typename T, typename TW = T, typename TC = T>
void gemv_rows(int64_t n, int64_t k, const T* x, const TW* w, int64_t ldw, TC* c, T alpha, T beta) {
  constexpr int64_t kLanes = 32;  // four vectors of partial sums: four FMA chains, not one
  constexpr int64_t kAhead = 16 * kLanes;  // 16-bit w prefetched 1 KiB ahead: 6 % off a bf16 sample run (Zen 3)
  for (int64_t j = 0; j < n; ++j) {
    const TW* wj = w + j * ldw;
    T part[kLanes] = {}, dot = 0;
    int64_t p = 0;
    for (; p + kLanes <= k; p += kLanes) {
      if constexpr (sizeof(TW) < sizeof(T)) __builtin_prefetch(wj + p + kAhead);
#pragma omp simd
      for (int64_t q = 0; q < kLanes; ++q) part[q] += x[p + q] * T(wj[p + q]);
    }
    for (; p < k; ++p) dot += x[p] * T(wj[p]);
    for (int64_t q = 0; q < kLanes; ++q) dot += part[q];
    c[j] = convert_scalar<TC>(alpha * dot + (beta == T(0) ? T(0) : beta * T(c[j])));
  }
}

// Products of at least this many multiply-adds are split across threads by gemm below.
constexpr double kSplitWork = double(1 << 20);

// One product on the calling thread (Eigen runs serially inside a parallel region).
template <typename T>
void gemm_one(int64_t m, int64_t n, int64_t k, const T* a, MatLayout la, const T* b, MatLayout lb, T* c,
              int64_t ldc, T alpha, T beta) {
  if (k == 0) {
    OutMat<T> C(c, m, n, OuterStride<>(ldc));
    if (beta == T(0)) C.setZero();
    else C *= beta;
    return;
  }
  // Every layout, transpose, alpha and beta goes to weft's kernel; matrix-vector products (m or
  // n of 1), which should not pay for packing a panel they read once, go to gemv_rows (a row
  // vector times a transposed matrix) or to Eigen's GEMV.
  if constexpr (std::is_same_v<T, float>) {
    if (SgemmFn fn = own_kernel(sgemm_kernel()).f32; fn && m > 1 && n > 1) {
      fn(m, n, k, a, la.rs(), la.cs(), b, lb.rs(), lb.cs(), c, ldc, alpha, beta);
      return;
    }
  }
  if (m == 1 && la.row_major && !lb.row_major) {  // x W^T for a Linear's W [n, k]: see gemv_rows
    gemv_rows(n, k, a, b, lb.ld, c, alpha, beta);
    return;
  }
  if (la.row_major && lb.row_major)
    gemm_eigen<T, Eigen::RowMajor, Eigen::RowMajor>(m, n, k, a, la.ld, b, lb.ld, c, ldc, alpha, beta);
  else if (la.row_major)
    gemm_eigen<T, Eigen::RowMajor, Eigen::ColMajor>(m, n, k, a, la.ld, b, lb.ld, c, ldc, alpha, beta);
  else if (lb.row_major)
    gemm_eigen<T, Eigen::ColMajor, Eigen::RowMajor>(m, n, k, a, la.ld, b, lb.ld, c, ldc, alpha, beta);
  else gemm_eigen<T, Eigen::ColMajor, Eigen::ColMajor>(m, n, k, a, la.ld, b, lb.ld, c, ldc, alpha, beta);
}

}  // namespace

std::atomic<int64_t> bgemm_sum_block{int64_t(4) << 20};

const char* sgemm_kernel_name(SgemmKernel k) {
  static constexpr const char* names[] = {"eigen", "avx2", "avx512", "avx512_8x48"};  // SgemmKernel's order
  return names[int(k)];
}

bool sgemm_kernel_supported(SgemmKernel k) {
#ifdef __x86_64__
  if (is_avx512(k)) return __builtin_cpu_supports("avx512f");
  if (k == SgemmKernel::avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return k == SgemmKernel::eigen;
}

SgemmKernel sgemm_kernel() {
  static const auto chosen = [] {
#ifdef __x86_64__
    const bool intel = __builtin_cpu_is("intel");
#else
    const bool intel = false;
#endif
    return choose_kernel("WEFT_CPU_GEMM", kAllSgemm, intel ? kIntelSgemm : kAllSgemm, sgemm_kernel_supported,
                         sgemm_kernel_name);
  }();
  return in_use(chosen, forced_sgemm);
}

void set_sgemm_kernel(SgemmKernel k) {
  WEFT_CHECK(sgemm_kernel_supported(k), "set_sgemm_kernel: this CPU cannot run the {} kernel", sgemm_kernel_name(k));
  forced_sgemm.store(int(k), std::memory_order_relaxed);
}

// Large products give each thread a contiguous slice of C's rows (or columns, when C is at least as wide as tall), each
// a serial product, instead of letting Eigen thread one product. Eigen's threads synchronise once per packed block of
// the shared operand; on a machine shared with other work, a descheduled thread stalls the other at every such point,
// while the slices meet only once. Each thread packs the shared operand itself, which costs little next to the slice's
// arithmetic; square products split by columns, so that each thread packs only its own columns of b (the larger share
// of the packing at 1024^3 with two threads: 87-89 % of the AVX-512 peak by rows, 91-93 % by columns on a Zen 5; the
// same for AVX2). Measured on the 2-core machine: 5-20 % more tokens/s in weft-transformer at 2 threads
// (docs/PERFORMANCE.md). The bf16 kernels read a row-major a in place (AMX: a depth of whole tiles), packing only b, so
// products with such an a split by columns (by rows every thread packed all of b: GPT large's forward products 2-5 %
// faster on two threads), unless c has too few columns for two slices (a LoRA adapter's 16).
namespace {

// Runs slice(r0, r1, c0, c1) over C: once over all of it, or per thread over slices. With `fixed` (kernels whose bits
// for an element depend on where its slice starts), the slices are a function of the shape alone, dealt to the threads
// there are (in turn on one thread or inside a parallel region), so that the product has the same bits on any thread
// count. Slices of rows (`by_rows`) start on multiples of `row_unit`, the kernel's register tile rows.
template <class F>
void split_product(int64_t m, int64_t n, int64_t k, bool fixed, int64_t row_unit, int64_t col_unit, bool by_rows,
                   F&& slice) {
  if (m == 0 || n == 0) return;
  const bool big = double(m) * double(n) * double(k) >= kSplitWork;
  const int64_t len = by_rows ? m : n;
  int64_t threads = 1;
#ifdef _OPENMP
  if (!omp_in_parallel() && big) threads = std::min<int64_t>(get_num_threads(), len / 16);
#endif
  const int64_t slices = !fixed ? threads : big ? reduction_chunks(len, 64) : 1;
  if (slices <= 1) return slice(0, m, 0, n);
  // Slices start on multiples of the kernel's tile (row_unit, col_unit) when large enough, so that only the
  // last one has a tail tile, each at the multiple nearest its even share: slices differ by at most one tile (2,048
  // rows on two threads in multiples of 96 instead of 12 gave one thread 13 % more work than the other).
  const int64_t unit = len >= 256 * slices ? (by_rows ? row_unit : col_unit) : 1;
  auto start = [&](int64_t t) { return t == slices ? len : (2 * len * t / slices + unit) / (2 * unit) * unit; };
#pragma omp parallel for num_threads(int(std::clamp<int64_t>(threads, 1, slices))) schedule(static, 1) if (threads > 1)
  for (int64_t t = 0; t < slices; ++t) {
    const int64_t p0 = start(t), p1 = start(t + 1);
    if (by_rows) slice(p0, p1, 0, n);
    else slice(0, m, p0, p1);
  }
}

// x W^T (one row x, W [n, k] row-major) with 16-bit operands: x widened once, W read in its own
// bytes by gemv_rows, columns split over threads as gemm splits them. Bitwise the widened
// blocks' product (gemm_widened), which also goes to gemv_rows, at half the bytes read.
template <typename T, typename TO>
void gemv_widened(int64_t n, int64_t k, const T* x, const T* w, MatLayout lw, TO* c, float alpha, float beta,
                  double* x_sum) {
  static thread_local Scratch<float> x_buf;
  float* xf = x_buf.get(k);
  if (x_sum) *x_sum = 0;
  widen_lines(x, k, 1, k, xf, x_sum, true);
  split_product(1, n, k, false, 1, 32, false, [&](int64_t, int64_t, int64_t c0, int64_t c1) {
    gemv_rows<float, T, TO>(c1 - c0, k, xf, col_at(w, lw, c0), lw.ld, c + c0, alpha, beta);
  });
}

// bf16 a and b on weft's f32 kernels, which widen them as they pack their panels: the bits of gemm_widened's f32
// copies without the copies (on Ice Lake: 0.78-0.84x the f32 product's speed with them, 0.82-0.99x without). Each
// thread's slice of c in blocks of at most kWidenedBlock elements when c is 16-bit; a's row sums in f64 along each row,
// as widen_lines adds them (a pass of their own over a). False where no own f32 kernel runs.
template <typename TO>
bool gemm_bf16_packing(int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b,
                       MatLayout lb, TO* c, int64_t ldc, float alpha, float beta, const TO* bias, double* a_sums) {
  const OwnKernel own = own_kernel(sgemm_kernel());
  if (!own.bf16 || m <= 1 || n <= 1 || k == 0) return false;
  for (int64_t i = 0; i < m && a_sums; ++i) a_sums[i] = 0;
  for (int64_t o = 0; o < (la.row_major ? m : k) && a_sums; ++o)
    for (int64_t e = 0; e < (la.row_major ? k : m); ++e) a_sums[la.row_major ? o : e] += float(a[o * la.ld + e]);
  split_product(m, n, k, false, own.rows, own.cols, m > n, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    // 16-bit c in blocks of at most 960 columns (20 and 30 tiles): each block packs its b and a again, which whole
    // rows of a wide c (a GPT-2 head's 8,192 columns: 128 rows a block) made a third of the product.
    const int64_t cb = std::is_same_v<TO, float> ? c1 - c0 : std::min<int64_t>(c1 - c0, 960);
    const int64_t rb = std::is_same_v<TO, float> ? r1 - r0 : std::max<int64_t>(1, kWidenedBlock / cb);
    for (int64_t j0 = c0; j0 < c1; j0 += cb)
      for (int64_t i0 = r0; i0 < r1; i0 += rb) {
        const int64_t rows = std::min(rb, r1 - i0), cols = std::min(cb, c1 - j0);
        through_f32(c + i0 * ldc + j0, ldc, rows, cols, beta, bias ? bias + j0 : nullptr,
                    [&](float* pc, int64_t ldpc, float bt) {
                      own.bf16(rows, cols, k, &row_at(a, la, i0)->bits, la.rs(), la.cs(), &col_at(b, lb, j0)->bits,
                               lb.rs(), lb.cs(), pc, ldpc, alpha, bt);
                    });
      }
  });
  return true;
}

using BgemmFn = decltype(&bgemm_amx);  // every bf16 kernel's signature (bgemm.h)

template <typename TO>
void bgemm_one(BgemmFn fn, int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b,
               MatLayout lb, TO* c, int64_t ldc, float alpha, float beta, const TO* bias, double* a_sums) {
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float v = beta == 0.0f ? 0.0f : beta * float(c[i * ldc + j]);
        c[i * ldc + j] = TO(bias ? v + float(bias[j]) : v);
      }
    return;
  }
  fn(m, n, k, &a->bits, la.rs(), la.cs(), &b->bits, lb.rs(), lb.cs(), c, std::is_same_v<TO, BFloat16>, ldc, alpha, beta,
     bias, a_sums);
}

}  // namespace

// Split over threads by split_product (above). weft's f32 kernels and gemv_rows give an
// element of C the same bits wherever its slice starts; Eigen does not (a row's products are
// summed in an order that depends on the row's place in its block), so its slices are fixed.
template <typename T>
void gemm(int64_t m, int64_t n, int64_t k, const T* a, MatLayout la, const T* b, MatLayout lb, T* c,
          int64_t ldc, T alpha, T beta) {
  const OwnKernel kernel = own_kernel(sgemm_kernel());
  const bool own = (std::is_same_v<T, float> && m > 1 && n > 1 && kernel.f32) || (m == 1 && la.row_major && !lb.row_major);
  split_product(m, n, k, !own, kernel.rows, kernel.cols, m > n, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    gemm_one<T>(r1 - r0, c1 - c0, k, row_at(a, la, r0), la, col_at(b, lb, c0), lb, c + r0 * ldc + c0, ldc, alpha, beta);
  });
}

bool bf16_gemm_native() {
#ifdef __x86_64__
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
  return cpu && is_avx512(sgemm_kernel());
#else
  return false;
#endif
}

const char* bgemm_kernel_name(BgemmKernel k) { return k == BgemmKernel::amx ? "amx" : "avx512bf16"; }

bool bgemm_kernel_supported(BgemmKernel k) {
  if (!bf16_gemm_native()) return false;
  if (k == BgemmKernel::avx512bf16) return true;
#if defined(__x86_64__) && defined(__linux__)
  // Linux hands out AMX's 8 KB of tile state only to a process that asks for it.
  // CPUID leaf 7, EDX bits 22 (AMX-BF16) and 24 (AMX-TILE): clang 14's __builtin_cpu_supports has no names for them.
  unsigned a = 0, b = 0, c = 0, d = 0;
  static const bool cpu = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
  static const bool granted =
      cpu && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
  return granted;
#else
  return false;
#endif
}

BgemmKernel bgemm_kernel() {
  static const auto chosen =
      choose_kernel("WEFT_CPU_BF16_GEMM", kAllBgemm, kAllBgemm, bgemm_kernel_supported, bgemm_kernel_name);
  return in_use(chosen, forced_bgemm);
}

void check_kernel_choices() {
  sgemm_kernel();
  const char* bf16 = std::getenv("WEFT_CPU_BF16_GEMM");
  if ((bf16 && *bf16) || bf16_gemm_native()) bgemm_kernel();
}

void set_bgemm_kernel(BgemmKernel k) {
  WEFT_CHECK(bgemm_kernel_supported(k), "set_bgemm_kernel: this CPU cannot run the {} kernel", bgemm_kernel_name(k));
  forced_bgemm.store(int(k), std::memory_order_relaxed);
}

bool gemm_bf16_sums_a(MatLayout la) { return bgemm_kernel() == BgemmKernel::avx512bf16 && !la.row_major && la.ld != 1; }

template <typename TO>
void gemm_bf16(int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b, MatLayout lb,
               TO* c, int64_t ldc, float alpha, float beta, const TO* bias, double* a_sums) {
  WEFT_CHECK(bf16_gemm_native(), "gemm_bf16: this CPU has no AVX512_BF16 (or WEFT_CPU_GEMM chose another kernel)");
  WEFT_CHECK(!a_sums || gemm_bf16_sums_a(la), "gemm_bf16: a's row sums need the avx512bf16 kernel and a column-major a");
  // a few rows of a times a Linear's W^T read W in place (bgemm.h), also on AMX CPUs
  const bool few_rows = m <= 4 && la.row_major && !lb.row_major && !a_sums;
  const bool amx = bgemm_kernel() == BgemmKernel::amx && !few_rows;
  const BgemmFn fn = few_rows ? bgemm_few_rows_avx512bf16 : amx ? bgemm_amx : bgemm_avx512bf16;
  // whole pairs (AMX: tiles) of depth; the vdpbf16ps kernel packs rows in one L1 set (gemm_scratch.h)
  const bool a_in_place = la.row_major && k % (amx ? 32 : 2) == 0 && (amx || !rows_share_l1_set<BFloat16>(la.ld));
  const bool by_rows = m > n && (!a_in_place || n < 64);  // a read in place: by columns, if enough for two
  // A LoRA adapter's weight gradients: few rows of c times a row-major b (dA), or few columns from a column-major a
  // (dB, as its transpose), the large operand read in place (bgemm.h)
  const bool plain = !amx && !few_rows && !a_sums && k > 0;
  const bool skinny = plain && m <= 32 && n > m && lb.row_major, skinny_t = plain && n <= 16 && m > n && !la.row_major;
  split_product(m, n, k, false, amx ? 32 : 12, 32, by_rows, [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    const BFloat16 *ar = row_at(a, la, r0), *bc = col_at(b, lb, c0);
    TO* cp = c + r0 * ldc + c0;
    constexpr bool c16 = std::is_same_v<TO, BFloat16>;
    if (skinny)
      return bgemm_skinny_avx512bf16(r1 - r0, c1 - c0, k, &ar->bits, la.rs(), la.cs(), &bc->bits, lb.rs(), cp, c16, ldc,
                                     false, alpha, beta, bias ? bias + c0 : nullptr);
    if (skinny_t)
      return bgemm_skinny_avx512bf16(c1 - c0, r1 - r0, k, &bc->bits, lb.cs(), lb.rs(), &ar->bits, la.cs(), cp, c16, ldc,
                                     true, alpha, beta, bias ? bias + c0 : nullptr);
    bgemm_one<TO>(fn, r1 - r0, c1 - c0, k, ar, la, bc, lb, cp, ldc, alpha, beta, bias ? bias + c0 : nullptr,
                  a_sums && c0 == 0 ? a_sums + r0 : nullptr);  // one slice per row
  });
}
template void gemm_bf16<float>(int64_t, int64_t, int64_t, const BFloat16*, MatLayout, const BFloat16*, MatLayout,
                               float*, int64_t, float, float, const float*, double*);
template void gemm_bf16<BFloat16>(int64_t, int64_t, int64_t, const BFloat16*, MatLayout, const BFloat16*,
                                  MatLayout, BFloat16*, int64_t, float, float, const BFloat16*, double*);
template void gemm<float>(int64_t, int64_t, int64_t, const float*, MatLayout, const float*, MatLayout, float*,
                          int64_t, float, float);
template void gemm<double>(int64_t, int64_t, int64_t, const double*, MatLayout, const double*, MatLayout,
                           double*, int64_t, double, double);

void matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.numel() == 0) return;
  dispatch_float(out.dtype(), "matmul", [&]<typename T>() { matmul_typed<T>(a, b, out); });
}

void dot(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (is_16bit(out.dtype())) {
    Tensor out32 = empty({});
    dot(a.to(DType::f32), b.to(DType::f32), out32);
    copy_elements(out, out32);
    return;
  }
  dispatch_float(out.dtype(), "dot", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      using Vec = Eigen::Matrix<T, Dynamic, 1>;
      int64_t n = a.numel(), sa = a.stride(0), sb = b.stride(0);
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T r = 0;
      if (sa == 1 && sb == 1) {
        r = Eigen::Map<const Vec>(pa, n).dot(Eigen::Map<const Vec>(pb, n));
      } else {
        for (int64_t i = 0; i < n; ++i) r += pa[i * sa] * pb[i * sb];
      }
      *out.data<T>() = r;
    }
  });
}

bool gemm(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta, const Tensor& bias,
          const Tensor& a_sums) {
  if (a.dtype() == DType::bf16 && bf16_gemm_native()) {  // the bias goes to the kernel (bgemm.h)
    Tensor A = with_layout(a), B = with_layout(b);
    const bool sums = a_sums.defined() && gemm_bf16_sums_a(mat_layout(A)) && B.size(1) > 0;  // n 0: no kernel runs
    std::vector<double> total(sums ? size_t(A.size(0)) : 0);
    auto run = [&]<typename TO>(TO* c) {
      gemm_bf16<TO>(A.size(0), B.size(1), A.size(1), A.data<BFloat16>(), mat_layout(A), B.data<BFloat16>(),
                    mat_layout(B), c, out.size(1), float(alpha), float(beta),
                    bias.defined() ? bias.data<TO>() : nullptr, sums ? total.data() : nullptr);
    };
    out.dtype() == DType::bf16 ? run(out.data<BFloat16>()) : run(out.data<float>());
    for (size_t i = 0; i < total.size(); ++i) a_sums.data<BFloat16>()[i] = convert_scalar<BFloat16>(total[i]);
    return sums;
  }
  if (is_16bit(a.dtype())) {
    Tensor A = with_layout(a), B = with_layout(b);
    std::vector<double> total(a_sums.defined() && B.size(1) > 0 ? size_t(A.size(0)) : 0);  // n 0: no product
    dispatch_float(a.dtype(), "gemm", [&]<typename T>() {
      if constexpr (!std::is_same_v<T, acc_t<T>>) {
        auto run = [&]<typename TO>(TO* c) {  // the bias starts each f32 block of out
          gemm_widened<T, TO>(A.size(0), B.size(1), A.size(1), A.data<T>(), mat_layout(A), B.data<T>(), mat_layout(B),
                              c, out.size(1), float(alpha), float(beta), bias.defined() ? bias.data<TO>() : nullptr,
                              total.empty() ? nullptr : total.data());
        };
        out.dtype() == DType::f32 ? run(out.data<float>()) : run(out.data<T>());
        for (size_t i = 0; i < total.size(); ++i) a_sums.data<T>()[i] = convert_scalar<T>(total[i]);
      }
    });
    return !total.empty();
  }
  if (bias.defined()) {  // elsewhere out starts as the bias rows and the product adds onto them
    copy_elements(out, bias.expand(out.shape()));
    return gemm(a, b, out, alpha, 1.0, Tensor(), a_sums);
  }
  dispatch_float(out.dtype(), "gemm", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      Tensor A = with_layout(a), B = with_layout(b);
      gemm<T>(A.size(0), B.size(1), A.size(1), A.data<T>(), mat_layout(A), B.data<T>(), mat_layout(B),
              out.data<T>(), out.size(1), T(alpha), T(beta));
    }
  });
  return false;
}

}  // namespace weft::kernels::cpu
