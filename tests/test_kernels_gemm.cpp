// Tests for weft's own GEMM kernels and their run-time choice: every f32 kernel this CPU runs
// (kernels/cpu/sgemm.h) and the bf16 ones (bgemm.h: bf16 inputs, f32 sums, f32 or bf16 results),
// against a double-precision loop over the same input values, on shapes with tails on every
// block edge, all four transposes, strided leading dims, alpha/beta, threads (the same bits on
// any thread count, Eigen's f64 too) and batched matmul; and the portable path of 16-bit
// products (the f32 kernels on widened blocks) on CPUs without AVX512_BF16.
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/half.h"
#include "core/tensor.h"
#include "kernels/cpu/bgemm.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/linalg.h"
#include "kernels/threads.h"
#include "test_util.h"

using namespace weft;
using namespace weft::kernels::cpu;

namespace {

// The kernels this CPU runs (weft's own ones only when `own`); the others are skipped, saying why.
std::vector<SgemmKernel> runnable(bool own) {
  std::vector<SgemmKernel> out;
  for (SgemmKernel k : {SgemmKernel::avx512, SgemmKernel::avx512_8x48, SgemmKernel::avx2, SgemmKernel::eigen}) {
    if (own && k == SgemmKernel::eigen) continue;
    if (sgemm_kernel_supported(k)) out.push_back(k);
    else std::printf("skipping the %s f32 GEMM kernel: this CPU does not have that instruction set\n", sgemm_kernel_name(k));
  }
  return out;
}

float next_value(uint64_t& s) {  // uniform in [-1, 1)
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return float(int64_t(s >> 40) - (1 << 23)) / float(1 << 23);
}

// c = alpha * op(a) op(b) + beta * c by `fn`, a and b of TI (float, or BFloat16: the values
// rounded to bf16), c of TO, where op(x) is x or x stored transposed, every matrix has `pad`
// unused columns past its width, and c's pad must stay untouched. The reference is a double
// loop over the same input values; the tolerance is the f32 summation bound for k products,
// 2^-23 (k + 2) sum |terms|, plus one bf16 rounding (2^-8 |c|) for a bf16 c: a result that
// passed through bf16 twice fails.
template <class TI = float, class TO = float, class Fn>
void check_gemm(Fn&& fn, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t pad, float alpha, float beta) {
  const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  uint64_t seed = uint64_t(m * 1000003 + n * 1009 + k);
  std::vector<TI> a((ta ? k : m) * lda), b((tb ? n : k) * ldb);
  std::vector<TO> c(m * ldc);
  for (TI& v : a) v = TI(next_value(seed));
  for (TI& v : b) v = TI(next_value(seed));
  for (TO& v : c) v = TO(beta == 0.0f ? NAN : float(TI(next_value(seed))));  // beta == 0 must not read c
  const std::vector<TO> c0 = c;
  fn(m, n, k, a.data(), ta ? col_major(lda) : row_major(lda), b.data(), tb ? col_major(ldb) : row_major(ldb), c.data(),
     ldc, alpha, beta);
  constexpr bool c16 = std::is_same_v<TO, BFloat16>;
  int bad = 0;
  std::string report;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      double got = float(c[i * ldc + j]), want = 0, mag = 0, was = float(c0[i * ldc + j]);
      if (j >= n) {  // padding
        if (std::isnan(got) && std::isnan(was)) continue;
        want = was;
      } else {
        for (int64_t p = 0; p < k; ++p) {
          double t = double(float(ta ? a[p * lda + i] : a[i * lda + p])) * float(tb ? b[j * ldb + p] : b[p * ldb + j]);
          want += t;
          mag += std::abs(t);
        }
        want = alpha * want + (beta == 0.0f ? 0.0 : beta * was);
        mag = std::abs(alpha) * mag + (beta == 0.0f ? 0.0 : std::abs(beta * was));
      }
      double tol = std::ldexp(double(k + 2), -23) * mag;
      if (c16) tol += std::ldexp(std::abs(want) + tol, -8);
      if (std::abs(got - want) <= tol) continue;
      if (bad++ < 6) report += fmt::format("  c[{}, {}] = {} want {} (diff {:.3g})\n", i, j, got, want, got - want);
    }
  INFO(fmt::format("{} c: m={} n={} k={} a{} b{} pad={} alpha={} beta={}: {} of {} elements differ\n{}",
                   c16 ? "bf16" : "f32", m, n, k, ta ? "^T" : "", tb ? "^T" : "", pad, alpha, beta, bad, m * ldc,
                   report));
  CHECK(bad == 0);
}

// each(m, n, k, ta, tb, pad, alpha, beta, i) for every (m, n, k) of dims x dims x depths, all
// transposes (the shapes past `largest` multiply-adds in one transpose each), rotating pads and
// alpha/beta; i counts the cases.
template <class Each>
void for_shapes(std::initializer_list<int64_t> dims, std::initializer_list<int64_t> depths, int64_t largest,
                Each&& each) {
  const float alphas[] = {1.0f, -0.5f, 2.0f}, betas[] = {0.0f, 1.0f, 0.25f};
  int i = 0;
  for (int64_t m : dims)
    for (int64_t n : dims)
      for (int64_t k : depths)
        for (int t = 0; t < 4; ++t, ++i)
          if (m * n * k <= largest || t == i % 4)
            each(m, n, k, bool(t & 1), bool(t & 2), int64_t((i % 3) * 3), alphas[i % 3], betas[(i / 3) % 3], i);
}

// Every f32 shape: the tails and block edges below.
template <class Fn>
void check_shapes(Fn&& fn) {
  for_shapes({1, 7, 17, 63, 65, 129, 300}, {1, 7, 17, 65, 257, 300}, 300 * 129 * 300,
             [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t pad, float alpha, float beta, int) {
               check_gemm(fn, m, n, k, ta, tb, pad, alpha, beta);
             });
  check_gemm(fn, 13, 2100, 20, false, true, 1, 1.0f, 0.5f);  // past one NC block of columns
  check_gemm(fn, 2, 3, 600, true, false, 0, 1.0f, 1.0f);     // past one KC block of depth
  check_gemm(fn, 40, 70, 1100, false, true, 2, 0.5f, 0.25f);  // three KC blocks, a tail in each dim
}

// The bf16 kernels this CPU runs; the others are skipped, saying why.
std::vector<BgemmKernel> bf16_kernels() {
  std::vector<BgemmKernel> out;
  for (BgemmKernel k : {BgemmKernel::amx, BgemmKernel::avx512bf16}) {
    if (bgemm_kernel_supported(k)) out.push_back(k);
    else std::printf("skipping the %s bf16 GEMM kernel: this CPU does not have it (AMX-BF16 with the tile state, "
                     "or AVX512_BF16 with avx512 as the GEMM kernel)\n", bgemm_kernel_name(k));
  }
  return out;
}



// One bf16 kernel itself, c of TO.
template <class TO>
auto bgemm_fn(decltype(&bgemm_amx) fn) {
  return [fn](int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b, MatLayout lb, TO* c,
              int64_t ldc, float alpha, float beta) {
    fn(m, n, k, &a->bits, la.rs(), la.cs(), &b->bits, lb.rs(), lb.cs(), c, std::is_same_v<TO, BFloat16>, ldc, alpha,
       beta, nullptr, nullptr);
  };
}
template <class TO>
auto bgemm_fn(BgemmKernel kernel) { return bgemm_fn<TO>(kernel == BgemmKernel::amx ? bgemm_amx : bgemm_avx512bf16); }
// bgemm_skinny_avx512bf16 as check_gemm calls it: b row-major read in place, or (transposed) a column-major, c
// written as the transpose of B^T A^T.
template <class TO>
auto skinny_fn(bool transposed) {
  return [transposed](int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b, MatLayout lb,
                      TO* c, int64_t ldc, float alpha, float beta) {
    constexpr bool c16 = std::is_same_v<TO, BFloat16>;
    if (!transposed)
      bgemm_skinny_avx512bf16(m, n, k, &a->bits, la.rs(), la.cs(), &b->bits, lb.rs(), c, c16, ldc, false, alpha, beta,
                              nullptr);
    else
      bgemm_skinny_avx512bf16(n, m, k, &b->bits, lb.cs(), lb.rs(), &a->bits, la.cs(), c, c16, ldc, true, alpha, beta,
                              nullptr);
  };
}
// The bf16 entry point without a bias, as check_gemm calls it.
template <class TO>
void entry_bf16(int64_t m, int64_t n, int64_t k, const BFloat16* a, MatLayout la, const BFloat16* b, MatLayout lb,
                TO* c, int64_t ldc, float alpha, float beta) {
  gemm_bf16<TO>(m, n, k, a, la, b, lb, c, ldc, alpha, beta);
}

}  // namespace

TEST_CASE("each f32 GEMM kernel matches a double loop on every shape, transpose and stride") {
  for (SgemmKernel kernel : runnable(true)) {
    SgemmFn fn = kernel == SgemmKernel::avx512        ? sgemm_avx512
                 : kernel == SgemmKernel::avx512_8x48 ? sgemm_avx512_8x48
                                                      : sgemm_avx2;
    INFO("kernel " << sgemm_kernel_name(kernel));
    auto direct = [&](int64_t m, int64_t n, int64_t k, const float* a, MatLayout la, const float* b, MatLayout lb,
                      float* c, int64_t ldc, float alpha, float beta) {
      fn(m, n, k, a, la.rs(), la.cs(), b, lb.rs(), lb.cs(), c, ldc, alpha, beta);
    };
    check_shapes(direct);
    // a's rows 4 KiB apart (1,024 floats): the AVX-512 kernel packs them rather than reading in
    // place (answers only: the speed is weft-bench's), past a KC block
    check_gemm<float, float>(direct, 30, 40, 1000, false, true, 24, 1.0f, 0.5f);
    check_gemm<float, float>(direct, 25, 70, 1024, false, false, 0, 1.0f, 0.0f);
  }
}

// Through kernels::cpu::gemm, which splits large products over threads and sends matrix-vector
// products to Eigen (a row vector times a transposed matrix to its own loop), with each kernel forced in turn (and Eigen's own, as a check of the test).
TEST_CASE("the f32 GEMM entry point gives the same answers with every kernel and thread count") {
  SgemmKernel saved = sgemm_kernel();
  int threads = get_num_threads();
  for (SgemmKernel kernel : runnable(false)) {
    set_sgemm_kernel(kernel);
    CHECK(sgemm_kernel() == kernel);
    for (int t : {1, 2}) {
      set_num_threads(t);
      INFO("kernel " << sgemm_kernel_name(kernel) << ", " << t << " threads");
      check_gemm(gemm<float>, 300, 129, 300, false, true, 3, 1.0f, 0.0f);
      check_gemm(gemm<float>, 65, 700, 257, true, false, 0, -0.5f, 1.0f);
      check_gemm(gemm<float>, 1, 300, 65, false, false, 2, 2.0f, 0.25f);
      check_gemm(gemm<float>, 1, 300, 65, false, true, 2, 2.0f, 0.25f);    // x W^T: one row at a time
      check_gemm(gemm<float>, 1, 2100, 600, false, true, 0, -0.5f, 0.0f);  // the same, split over threads
      check_gemm(gemm<float>, 129, 1, 17, true, true, 1, 1.0f, 1.0f);
      check_gemm(gemm<float>, 530, 40, 64, false, true, 1, 1.0f, 0.0f);  // slices on 12-row edges
      check_gemm(gemm<float>, 40, 600, 64, true, false, 0, 1.0f, 0.5f);  // slices on 32-column edges
    }
  }
  set_num_threads(threads);
  set_sgemm_kernel(saved);
}

// Every route (weft's f32 and bf16 kernels, Eigen for f64, matrix-vector products and the eigen
// kernel) gives the same bits on 1 to 4 threads, tail tiles and general alpha and beta included.
TEST_CASE("GEMMs give the same bits on any number of threads") {
  Generator gen(21);
  struct Case {
    int64_t m, n, k;
    double alpha, beta;
  };
  std::vector<Case> cases = {
      {300, 129, 300, 1, 0},   {65, 700, 257, -0.5, 1}, {530, 40, 64, 1, 0},   {40, 600, 64, 1, 0.5},
      {3000, 1, 300, 1, 0.5},  {1, 2100, 600, 1, 0},    {150, 150, 150, 1, 0}, {700, 70, 1100, 1, 1},
      {1000, 300, 77, 2, 0.25},
  };
  auto run_cases = [&](DType dt) {
    for (const Case& c : cases) {
      INFO(dtype_name(dt) << " " << c.m << " x " << c.n << " x " << c.k << ", beta " << c.beta);
      Tensor a = randn({c.m, c.k}, {.dtype = dt}, &gen), b = randn({c.k, c.n}, {.dtype = dt}, &gen);
      Tensor c0 = randn({c.m, c.n}, {.dtype = dt}, &gen);
      test::check_same_bits_on_any_thread_count([&] {
        Tensor out = c0.clone();
        kernels::cpu::gemm(a, b, out, c.alpha, c.beta, Tensor(), Tensor());
        return std::vector<Tensor>{out};
      });
    }
    Tensor a = randn({16, 64, 96}, {.dtype = dt}, &gen), b = randn({16, 96, 80}, {.dtype = dt}, &gen);
    INFO("batched " << dtype_name(dt));
    test::check_same_bits_on_any_thread_count([&] {
      Tensor out = empty({16, 64, 80}, {.dtype = dt});
      matmul(a, b, out);
      return std::vector<Tensor>{out};
    });
  };
  SgemmKernel saved = sgemm_kernel();
  for (SgemmKernel kernel : runnable(false)) {
    INFO("kernel " << sgemm_kernel_name(kernel));
    set_sgemm_kernel(kernel);
    run_cases(kFloat32);
  }
  set_sgemm_kernel(saved);
  run_cases(kFloat64);
  if (bf16_gemm_native()) run_cases(kBFloat16);
}

TEST_CASE("batched f32 matmul matches f64 with every kernel") {
  Generator gen(7);
  auto check = [](const Tensor& a, const Tensor& b) {
    std::vector<double> got = to_vector(kernels::matmul(a, b));
    std::vector<double> want = to_vector(kernels::matmul(a.to(kFloat64), b.to(kFloat64)));
    REQUIRE(got.size() == want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::abs(got[i] - want[i]) > 1e-4 * (1 + std::abs(want[i])) && bad++ < 6)
        FAIL_CHECK(fmt::format("[{}] got {} want {}", i, got[i], want[i]));
  };
  SgemmKernel saved = sgemm_kernel();
  for (SgemmKernel kernel : runnable(false)) {
    set_sgemm_kernel(kernel);
    INFO("kernel " << sgemm_kernel_name(kernel));
    check(randn({4, 33, 70}, {}, &gen), randn({45, 70}, {}, &gen).t());               // folded rows, B^T view
    check(randn({6, 17, 65}, {}, &gen), randn({6, 65, 129}, {}, &gen));               // batch split over threads
    check(randn({2, 3, 40, 16}, {}, &gen), randn({2, 3, 40, 16}, {}, &gen).transpose(-1, -2));  // q k^T
    check(randn({2, 150, 130}, {}, &gen).transpose(-1, -2), randn({2, 150, 170}, {}, &gen));     // a^T views
  }
  set_sgemm_kernel(saved);
}

// WEFT_CPU_GEMM is read once per process, so these run in a child process of this test program.
const char* const kEnvTest = "WEFT_CPU_GEMM picks the kernel and a bad value is a clear error";
TEST_CASE(kEnvTest, "[.]") {
  const char* env = std::getenv("WEFT_CPU_GEMM");
  REQUIRE(env != nullptr);
  Tensor a = ones({8, 8}), b = ones({8, 8});
  if (std::string(env) == "eigen") {
    CHECK(sgemm_kernel() == SgemmKernel::eigen);
    CHECK(to_vector(kernels::matmul(a, b))[0] == 8.0);
  } else {
    using Catch::Contains;
    CHECK_THROWS_WITH(kernels::matmul(a, b), Contains("WEFT_CPU_GEMM=" + std::string(env)) &&
                                                 Contains("allowed values: avx512, avx512_8x48, avx2, eigen"));
  }
}

// WEFT_CPU_BF16_GEMM likewise, in a child process: a bad value is an error at the first bf16 GEMM.
const char* const kBf16EnvTest = "WEFT_CPU_BF16_GEMM picks the bf16 kernel and a bad value is a clear error";
TEST_CASE(kBf16EnvTest, "[.]") {
  const char* env = std::getenv("WEFT_CPU_BF16_GEMM");
  REQUIRE(env != nullptr);
  Tensor a = ones({8, 8}).to(kBFloat16), b = ones({8, 8}).to(kBFloat16);
  if (std::string(env) == "avx512bf16") {
    CHECK(bgemm_kernel() == BgemmKernel::avx512bf16);
    CHECK(to_vector(kernels::matmul(a, b))[0] == 8.0);
  } else {
    using Catch::Contains;
    CHECK_THROWS_WITH(kernels::matmul(a, b), Contains("WEFT_CPU_BF16_GEMM=" + std::string(env)) &&
                                                 Contains("allowed values: amx, avx512bf16"));
  }
}

TEST_CASE("WEFT_CPU_BF16_GEMM is honoured by a fresh process") {
  if (!bgemm_kernel_supported(BgemmKernel::avx512bf16)) {
    std::printf("skipping WEFT_CPU_BF16_GEMM: this CPU runs no bf16 GEMM kernel\n");
    return;
  }
  for (const char* value : {"avx512bf16", "bogus"}) {
    std::string cmd = fmt::format("WEFT_CPU_BF16_GEMM={} '{}' '{}' > /dev/null", value,
                                  std::filesystem::read_symlink("/proc/self/exe").string(), kBf16EnvTest);
    INFO(cmd);
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("the f32 GEMM kernel by default: AVX-512's 8 x 48 tile on Intel, its 12 x 32 elsewhere, else AVX2") {
#ifdef __x86_64__
  if (const char* env = std::getenv("WEFT_CPU_GEMM"); env && *env) {
    std::printf("skipping the default f32 GEMM kernel: WEFT_CPU_GEMM=%s chooses it\n", env);
    return;
  }
  const SgemmKernel want = !__builtin_cpu_supports("avx512f") ? (sgemm_kernel_supported(SgemmKernel::avx2)
                                                                     ? SgemmKernel::avx2
                                                                     : SgemmKernel::eigen)
                           : __builtin_cpu_is("intel") ? SgemmKernel::avx512_8x48
                                                       : SgemmKernel::avx512;
  CHECK(std::string(sgemm_kernel_name(sgemm_kernel())) == sgemm_kernel_name(want));
#endif
}

TEST_CASE("WEFT_CPU_GEMM is honoured by a fresh process") {
  for (const char* value : {"eigen", "bogus"}) {
    std::string cmd = fmt::format("WEFT_CPU_GEMM={} '{}' '{}' > /dev/null", value,
                                  std::filesystem::read_symlink("/proc/self/exe").string(), kEnvTest);
    INFO(cmd);
    CHECK(std::system(cmd.c_str()) == 0);
  }
}

TEST_CASE("each bf16 GEMM kernel matches a double loop on every shape, transpose, stride and output type") {
  for (BgemmKernel kernel : bf16_kernels()) {
    INFO("kernel " << bgemm_kernel_name(kernel));
    auto f32 = bgemm_fn<float>(kernel);
    auto b16 = bgemm_fn<BFloat16>(kernel);
    for_shapes({1, 7, 13, 33, 65, 145, 300}, {1, 2, 7, 64, 257, 300}, 145 * 65 * 300,
               [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t pad, float alpha, float beta, int i) {
                 if (i % 2) check_gemm<BFloat16, float>(f32, m, n, k, ta, tb, pad, alpha, beta);
                 else check_gemm<BFloat16, BFloat16>(b16, m, n, k, ta, tb, pad, alpha, beta);
               });
    for (int t = 0; t < 4; ++t) {
      check_gemm<BFloat16, float>(f32, 13, 1100, 20, t & 1, t & 2, 1, 1.0f, 0.5f);      // past one NC block of columns
      check_gemm<BFloat16, float>(f32, 13, 1100, 1024, t & 1, t & 2, 0, 1.0f, 0.5f);    // the same at a full KC depth
      check_gemm<BFloat16, BFloat16>(b16, 40, 70, 4301, t & 1, t & 2, 2, 0.5f, 0.25f);  // three or more KC blocks, odd k
      check_gemm<BFloat16, float>(f32, 300, 40, 2100, t & 1, t & 2, 0, 1.0f, 1.0f);     // two or more KC blocks
      check_gemm<BFloat16, float>(f32, 96, 64, 1024, t & 1, t & 2, 0, 1.0f, 1.0f);      // whole tiles, c accumulated
    }
    // A bf16 result deeper than one depth block summed in f32 blocks of 2,048 sums instead of
    // 4 Mi: of columns (c wider than tall; a's row sums taken once), then of rows.
    const int64_t sum_block = bgemm_sum_block.exchange(2048);
    check_gemm<BFloat16, BFloat16>(b16, 40, 300, 2100, false, true, 0, 1.0f, 0.5f);
    check_gemm<BFloat16, BFloat16>(b16, 40, 300, 2100, true, false, 1, 0.5f, 0.0f);
    check_gemm<BFloat16, BFloat16>(b16, 300, 40, 2100, true, true, 0, 1.0f, 1.0f);
    bgemm_sum_block = sum_block;
    // a^T packed once for two column blocks (of 1,024 columns for a transposed a), over two row blocks and two KC blocks
    check_gemm<BFloat16, float>(f32, 150, 1100, 2100, true, false, 1, 1.0f, 0.5f);
    // 16 columns: one vector per tile row (a LoRA adapter's x A^T, dY B), full tiles and a row tail
    for (int t = 0; t < 4; ++t) {
      check_gemm<BFloat16, float>(f32, 300, 16, 300, t & 1, t & 2, 1, 1.0f, 0.5f);
      check_gemm<BFloat16, BFloat16>(b16, 145, 16, 2100, t & 1, t & 2, 0, -0.5f, 1.0f);
    }
    // a's rows 4 KiB apart (2,048 bf16: packed rather than read in place), one and two KC blocks
    check_gemm<BFloat16, BFloat16>(b16, 50, 40, 2000, false, true, 48, 1.0f, 0.0f);
    check_gemm<BFloat16, float>(f32, 40, 70, 2100, false, false, 1996, 1.0f, 1.0f);
  }
  if (!bgemm_kernel_supported(BgemmKernel::avx512bf16)) return;  // bf16_kernels() said why, above
  // a LoRA adapter's weight gradients (bgemm_skinny_avx512bf16): up to 32 rows times a row-major b, and its
  // transpose (few columns from a column-major a); row passes of 8 and 16, column and depth tails, beyond a KC block
  for (bool tr : {false, true})
    for (int64_t few : {1, 8, 9, 16, 17, 32})
      for (int64_t k : {1, 2, 7, 300, 4301}) {
        const int64_t m = tr ? 77 : few, n = tr ? few : 77, pad = k % 3;
        check_gemm<BFloat16, float>(skinny_fn<float>(tr), m, n, k, tr, false, pad, 1.0f, k % 2 ? 0.0f : 0.5f);
        check_gemm<BFloat16, BFloat16>(skinny_fn<BFloat16>(tr), m, n, k, tr, false, pad, -0.5f, 1.0f);
      }
  check_gemm<BFloat16, float>(skinny_fn<float>(false), 16, 384, 2048, true, false, 0, 1.0f, 0.0f);
  check_gemm<BFloat16, float>(skinny_fn<float>(true), 1024, 16, 2048, true, false, 0, 1.0f, 1.0f);
  // up to 4 rows of a times a Linear's W^T, read in place (bgemm_few_rows_avx512bf16; its answers:
  // depth tails of the 32-value vectors and 128-value steps, past a KC block; its speed is
  // scripts/bench_1b.sh's decode rows)
  auto f32 = bgemm_fn<float>(bgemm_few_rows_avx512bf16);
  auto b16 = bgemm_fn<BFloat16>(bgemm_few_rows_avx512bf16);
  for (int64_t m : {1, 2, 3, 4})
    for (int64_t k : {1, 31, 129, 4301}) {
      check_gemm<BFloat16, float>(f32, m, 37, k, false, true, m - 1, 1.0f, 0.5f);
      check_gemm<BFloat16, BFloat16>(b16, m, 37, k, false, true, 2, -0.5f, 1.0f);
    }
}

TEST_CASE("the bf16 GEMM entry point splits over threads and gives the kernel's answers") {
  if (bf16_kernels().empty()) return;
  const BgemmKernel saved = bgemm_kernel();
  int threads = get_num_threads();
  for (BgemmKernel kernel : bf16_kernels()) {
    set_bgemm_kernel(kernel);
    CHECK(bgemm_kernel() == kernel);
    for (int t : {1, 2}) {
      set_num_threads(t);
      INFO("kernel " << bgemm_kernel_name(kernel) << ", " << t << " threads");
      check_gemm<BFloat16, float>(entry_bf16<float>, 300, 129, 300, false, true, 3, 1.0f, 0.0f);
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 65, 700, 257, true, false, 0, -0.5f, 1.0f);
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 530, 40, 64, true, true, 1, 1.0f, 0.0f);  // slices on row-tile edges
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 530, 40, 64, false, true, 1, 1.0f, 0.0f);  // a in place, few columns: by rows
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 530, 100, 64, false, true, 1, 1.0f, 0.0f);  // a read in place: by columns
      check_gemm<BFloat16, float>(entry_bf16<float>, 40, 600, 64, true, false, 0, 1.0f, 0.5f);        // slices on 32-column edges
      check_gemm<BFloat16, float>(entry_bf16<float>, 1, 300, 65, false, false, 2, 2.0f, 0.25f);
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 3, 700, 257, false, true, 1, 1.0f, 0.5f);  // a few rows, W^T
      check_gemm<BFloat16, BFloat16>(entry_bf16<BFloat16>, 20, 30, 0, false, false, 0, 1.0f, 0.5f);  // k = 0: beta * c
      check_gemm<BFloat16, float>(entry_bf16<float>, 16, 700, 2048, true, false, 1, 1.0f, 0.0f);  // a LoRA dA: skinny
      check_gemm<BFloat16, float>(entry_bf16<float>, 700, 16, 2048, true, false, 0, 1.0f, 1.0f);  // its dB, transposed
    }
  }
  // a^T too large to keep (4,100 x 2,048 values, past 8 Mi), packed again for each of two column blocks: against the f32
  // GEMM of the same values (a stale packing is off by O(1), the sums' order by ~1e-5).
  Generator gen(3);
  Tensor a = randn({2048, 4100}, {}, &gen).to(kBFloat16), b = randn({2048, 1040}, {}, &gen).to(kBFloat16);
  Tensor want = empty({4100, 1040}), got = empty({4100, 1040});
  kernels::gemm(a.to(kFloat32), true, b.to(kFloat32), false, want);
  set_num_threads(1);
  for (BgemmKernel kernel : bf16_kernels()) {
    set_bgemm_kernel(kernel);
    kernels::gemm(a, true, b, false, got);
    INFO("kernel " << bgemm_kernel_name(kernel) << ": a^T 4100 x 2048 times 2048 x 1040");
    test::check_values(got, to_vector(want), 1e-4, 1e-3);
  }
  set_num_threads(threads);
  set_bgemm_kernel(saved);
}

// kernels::gemm's bias row: every kernel adds it as it stores a tile (or the f32 kernels start
// out, or its f32 blocks, as the bias rows), with the same bits as filling out with the bias and adding the
// product with beta 1, and within f32 rounding of a double loop that adds it; the split
// over threads (by rows and by columns), tail tiles, f32 and bf16 results, several depth
// blocks (bf16 summed in f32 and rounded once) included. Bad biases are refused.
TEST_CASE("gemm adds a bias row as filling out with it and adding the product would") {
  Generator gen(5);
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  const std::vector<Case> cases = {{300, 129, 300, false, true}, {65, 700, 257, true, false}, {530, 40, 64, false, true},
                                   {40, 600, 64, true, false},   {37, 45, 2100, false, true}, {1, 300, 65, false, false},
                                   {3, 300, 65, false, true},    {16, 300, 65, true, false},  {300, 16, 64, true, false},
                                   {300, 16, 64, false, true},
                                   {20, 30, 0, false, false}};  // no depth: the bias alone
  auto run = [&](const char* route) {
    for (auto [dt, out_dt] : {std::pair{kFloat32, kFloat32}, std::pair{kBFloat16, kBFloat16}, std::pair{kBFloat16, kFloat32},
                              std::pair{kFloat16, kFloat16}})
        for (const Case& c : cases) {
          INFO(route << ": " << dtype_name(dt) << " -> " << dtype_name(out_dt) << " " << c.m << " x " << c.n << " x "
                     << c.k);
          Tensor a = randn(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, {.dtype = dt}, &gen);
          Tensor b = randn(c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, {.dtype = dt}, &gen);
          Tensor bias = randn({c.n}, {.dtype = out_dt}, &gen);
          for (int t : {1, 2}) {
            set_num_threads(t);
            Tensor got = empty({c.m, c.n}, {.dtype = out_dt}), filled = empty({c.m, c.n}, {.dtype = out_dt});
            kernels::gemm(a, c.ta, b, c.tb, got, 0.5, 0.0, bias);
            filled.copy_(bias);
            kernels::gemm(a, c.ta, b, c.tb, filled, 0.5, 1.0);
            CHECK(std::memcmp(got.data_ptr(), filled.data_ptr(), size_t(got.nbytes())) == 0);  // the same bits
            Tensor a64 = c.ta ? a.to(kFloat64).t() : a.to(kFloat64), b64 = c.tb ? b.to(kFloat64).t() : b.to(kFloat64);
            Tensor want = kernels::matmul(a64, b64).to(kFloat64);
            std::vector<double> g = to_vector(got), w = to_vector(want), bv = to_vector(bias);
            int bad = 0;
            for (size_t i = 0; i < g.size(); ++i) {
              const double x = 0.5 * w[i] + bv[i % size_t(c.n)];
              const double tol = 1e-4 * (1 + std::abs(x)) + (out_dt == kBFloat16 ? std::ldexp(std::abs(x), -8)
                                                              : out_dt == kFloat16 ? std::ldexp(std::abs(x), -11) : 0.0);
              if (std::abs(g[i] - x) > tol && bad++ < 4) FAIL_CHECK(fmt::format("[{}] got {} want {}", i, g[i], x));
            }
          }
        }
  };
  const int threads = get_num_threads();
  if (bf16_gemm_native()) {
    const BgemmKernel saved = bgemm_kernel();
    for (BgemmKernel kernel : bf16_kernels()) {
      set_bgemm_kernel(kernel);
      run(bgemm_kernel_name(kernel));
    }
    set_bgemm_kernel(saved);
  }
  // The f32 kernels: out filled with the bias first for f32 operands; bf16 and f16 ones without a bf16 kernel start
  // each f32 block of out as the bias rows.
  const SgemmKernel saved = sgemm_kernel();
  for (SgemmKernel kernel : runnable(false)) {
    set_sgemm_kernel(kernel);
    run(sgemm_kernel_name(kernel));
  }
  set_sgemm_kernel(saved);
  set_num_threads(threads);
  Tensor a = randn({8, 16}, {}, &gen), b = randn({16, 24}, {}, &gen), out = empty({8, 24});
  CHECK_THROWS_WITH(kernels::gemm(a, false, b, false, out, 1.0, 0.0, randn({23}, {}, &gen)),
                    Catch::Matchers::Contains("bias") && Catch::Matchers::Contains("[24]"));
  CHECK_THROWS_WITH(kernels::gemm(a, false, b, false, out, 1.0, 0.0, randn({24}, {.dtype = kFloat64}, &gen)),
                    Catch::Matchers::Contains("out's dtype"));
  CHECK_THROWS_WITH(kernels::gemm(a, false, b, false, out, 1.0, 1.0, randn({24}, {}, &gen)),
                    Catch::Matchers::Contains("beta 0"));
}

// a_sums: the sums of op(a)'s rows beside the product (a linear layer's bias gradient beside its
// weight gradient). Where the vdpbf16ps kernel packs a transposed a it sums as it packs: over
// several row blocks, column blocks (a packed once, and again per column block when too large to
// keep), depth blocks, and both splits over two threads. Elsewhere reduce(sum) of a.
TEST_CASE("gemm sums op(a)'s rows beside the product, as reduce(sum) would") {
  Generator gen(6);
  struct Case {
    int64_t m, n, k;
    bool ta, out16 = false;  // out16: c in a's dtype
  };
  const std::vector<Case> cases = {{300, 129, 300, true}, {65, 700, 257, true}, {37, 45, 2100, true},
                                   {4100, 1040, 2048, true}, {40, 600, 64, true}, {530, 40, 64, false},
                                   {20, 30, 0, true},       {20, 0, 30, true},  // no depth; no columns
                                   {37, 45, 2100, true, true}};  // bf16 c summed in f32 column blocks
  const int64_t sum_block = bgemm_sum_block.exchange(512);  // of 32 columns at 37 rows
  auto run = [&](const char* route, bool native) {
    for (DType dt : {kFloat32, kBFloat16})
      for (const Case& c : cases) {
        if (c.m * c.k > (int64_t(8) << 20) && !(native && dt == kBFloat16)) continue;  // only the kernel's repacking
        INFO(route << ": " << dtype_name(dt) << " " << c.m << " x " << c.n << " x " << c.k << (c.ta ? " a^T" : ""));
        Tensor a = randn(c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, {.dtype = dt}, &gen);
        Tensor b = randn({c.k, c.n}, {.dtype = dt}, &gen);
        std::vector<double> av = to_vector(a), w(size_t(c.m)), s(size_t(c.m));  // op(a)'s row sums, |.| sums
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t p = 0; p < c.k; ++p) {
            const double x = av[size_t(c.ta ? p * c.m + i : i * c.k + p)];
            w[size_t(i)] += x, s[size_t(i)] += std::abs(x);
          }
        for (int t : {1, 2}) {
          set_num_threads(t);
          const DType out_dt = c.out16 ? dt : kFloat32;
          Tensor sums = full({c.m}, 7.0, {.dtype = dt}), out = empty({c.m, c.n}, {.dtype = out_dt}),
                 plain = empty({c.m, c.n}, {.dtype = out_dt});
          kernels::gemm(a, c.ta, b, false, out, 1.0, 0.0, {}, sums);
          kernels::gemm(a, c.ta, b, false, plain);
          // The product as without the sums (an empty one has no data to compare).
          CHECK((out.numel() == 0 || std::memcmp(out.data_ptr(), plain.data_ptr(), size_t(out.nbytes())) == 0));
          std::vector<double> g = to_vector(sums);
          int bad = 0;
          for (size_t i = 0; i < g.size(); ++i) {
            const double tol = 1e-5 * s[i] + (dt == kBFloat16 ? std::ldexp(std::abs(w[i]), -8) : 0.0);
            if (std::abs(g[i] - w[i]) > tol && bad++ < 4)
              FAIL_CHECK(fmt::format("threads {} row {}: got {} want {}", t, i, g[i], w[i]));
          }
          CHECK(bad == 0);
        }
      }
  };
  const int threads = get_num_threads();
  if (bf16_gemm_native()) {
    const BgemmKernel saved = bgemm_kernel();
    for (BgemmKernel kernel : bf16_kernels()) {
      set_bgemm_kernel(kernel);
      run(bgemm_kernel_name(kernel), true);
    }
    set_bgemm_kernel(saved);
  }
  const SgemmKernel saved = sgemm_kernel();
  set_sgemm_kernel(SgemmKernel::eigen);
  run("portable (reduce)", false);
  set_sgemm_kernel(saved);
  set_num_threads(threads);
  bgemm_sum_block = sum_block;
  Tensor a = randn({8, 16}, {}, &gen), b = randn({16, 24}, {}, &gen), out = empty({8, 24});
  CHECK_THROWS_WITH(kernels::gemm(a, false, b, false, out, 1.0, 0.0, {}, empty({16})),
                    Catch::Matchers::Contains("a_sums") && Catch::Matchers::Contains("[8]"));
  CHECK_THROWS_WITH(kernels::gemm(a, false, b, false, out, 1.0, 0.0, {}, empty({8}, {.dtype = kBFloat16})),
                    Catch::Matchers::Contains("a's dtype"));
}

// bf16 matmul of tensors, native and portable: the answer is the bf16 inputs' product summed in
// f32 (within f32 rounding of the double one, plus the result's bf16 rounding), not the f32
// inputs' product, which differs (by 2^-8 where x = 1 + 2^-8, which bf16 rounds to 1).
TEST_CASE("bf16 matmul computes the product of the bf16-rounded inputs, with the kernel or through f32") {
  Generator gen(11);
  auto check = [](const Tensor& a32, const Tensor& b32) {
    Tensor a = a32.to(kBFloat16), b = b32.to(kBFloat16);
    Tensor got = kernels::matmul(a, b);
    REQUIRE(got.dtype() == kBFloat16);
    std::vector<double> g = to_vector(got), want = to_vector(kernels::matmul(a.to(kFloat64), b.to(kFloat64)));
    std::vector<double> f32 = to_vector(kernels::matmul(a32.to(kFloat64), b32.to(kFloat64)));
    int bad = 0, apart = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (std::abs(g[i] - want[i]) > 1e-5 * (1 + std::abs(want[i])) + std::ldexp(std::abs(want[i]), -8) && bad++ < 6)
        FAIL_CHECK(fmt::format("[{}] got {} want {}", i, g[i], want[i]));
      apart += std::abs(g[i] - f32[i]) > std::ldexp(std::abs(f32[i]), -10);
    }
    CHECK(apart > 0);  // the f32 inputs' answer is far from the bf16 inputs' one
  };
  auto run = [&] {
    check(full({64, 96}, 1.0 + std::ldexp(1.0, -8)), randn({96, 40}, {}, &gen));  // x rounds to 1 in bf16
    check(randn({4, 33, 70}, {}, &gen), randn({45, 70}, {}, &gen).t());               // folded rows, B^T view
    check(randn({6, 17, 65}, {}, &gen), randn({6, 65, 129}, {}, &gen));               // batch split over threads
    check(randn({2, 150, 130}, {}, &gen).transpose(-1, -2), randn({2, 150, 170}, {}, &gen));  // a^T views
  };
  if (bf16_gemm_native()) {
    const BgemmKernel saved = bgemm_kernel();
    for (BgemmKernel kernel : bf16_kernels()) {
      set_bgemm_kernel(kernel);
      INFO("bf16 kernel " << bgemm_kernel_name(kernel));
      run();
    }
    set_bgemm_kernel(saved);
  }
  SgemmKernel saved = sgemm_kernel();
  set_sgemm_kernel(SgemmKernel::eigen);
  CHECK_FALSE(bf16_gemm_native());
  {
    INFO("portable path (through f32)");
    run();
  }
  set_sgemm_kernel(saved);
}

// Without a bf16 kernel (f16 always; bf16 where the CPU has no AVX512_BF16), a 16-bit product
// runs on f32 copies of blocks of a's rows and b's columns of at most 2^20 elements (bf16 on
// weft's f32 kernels: widened as the kernel packs its panels, c in blocks of that size):
// the answer has the bits of the f32 product of whole f32 copies, rounded once, over several
// row and column blocks (k = 8400: 124 rows and columns a block), every transpose, a 16-bit out
// with alpha and beta, an f32 out with a bias, and op(a)'s row sums (taken once, not once per
// column block); and the call allocates no tensor (the copies live in the thread's buffers).
// Eigen (CPUs without AVX2 + FMA) sums in an order that depends on where a block starts, as it
// does for its thread slices: there the answer is within f32 rounding instead.
// One row (m 1: a decode step's x W^T) reads the 16-bit b in place instead of copying blocks.
TEST_CASE("the portable 16-bit GEMM works on blocks of f32 copies and gives whole copies' bits") {
  Generator gen(13);
  const int64_t n = 135, k = 8400;
  const SgemmKernel saved = sgemm_kernel();
  const bool native = bf16_gemm_native();
  for (SgemmKernel kernel : runnable(false)) {
    if (is_avx512(kernel) && native) continue;  // where the bf16 kernels take bf16
    set_sgemm_kernel(kernel);
    auto check = [&](const Tensor& want, const Tensor& got, const std::string& what) {
      if (kernel != SgemmKernel::eigen) return test::check_same_bits(want, got, what);
      const double ulp = is_16bit(want.dtype()) ? std::ldexp(1.0, -7) : 1e-5;  // sums of 8400 terms ~ 1
      const std::vector<double> w = to_vector(want), g = to_vector(got);
      int bad = 0;
      for (size_t i = 0; i < w.size(); ++i)
        if (std::abs(g[i] - w[i]) > ulp * std::abs(w[i]) + 1e-3 && bad++ < 4)
          FAIL_CHECK(fmt::format("{}: [{}] got {} want {}", what, i, g[i], w[i]));
    };
    for (int64_t m : {131, 1})
    for (DType dt : {kBFloat16, kFloat16})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const std::string name = fmt::format("{} kernel, m {}, {}{}{}", sgemm_kernel_name(kernel), m,
                                               dtype_name(dt), ta ? " a^T" : "", tb ? " b^T" : "");
          Tensor a = randn(ta ? Shape{k, m} : Shape{m, k}, {.dtype = dt}, &gen);
          Tensor b = randn(tb ? Shape{n, k} : Shape{k, n}, {.dtype = dt}, &gen);
          Tensor c0 = randn({m, n}, {.dtype = dt}, &gen), bias = randn({n}, {}, &gen);
          const Tensor a32 = a.to(kFloat32), b32 = b.to(kFloat32);
          Tensor want = c0.to(kFloat32), got = c0.clone();
          kernels::gemm(a32, ta, b32, tb, want, 0.5, 0.25);
          const int64_t live = memory_stats().live_bytes;
          reset_peak_memory_stats();
          kernels::gemm(a, ta, b, tb, got, 0.5, 0.25);
          CHECK(memory_stats().peak_bytes == live);
          check(want.to(dt), got, name + ", 16-bit out");
          Tensor want32 = empty({m, n}), got32 = empty({m, n}), sums = empty({m}, {.dtype = dt});
          kernels::gemm(a32, ta, b32, tb, want32, 1.0, 0.0, bias);
          kernels::gemm(a, ta, b, tb, got32, 1.0, 0.0, bias, sums);
          check(want32, got32, name + ", f32 out with a bias");
          const std::vector<double> av = to_vector(a);
          std::vector<double> row_sums(static_cast<size_t>(m), 0.0);  // exact in f64, rounded through f32
          for (int64_t i = 0; i < m; ++i)
            for (int64_t p = 0; p < k; ++p) row_sums[size_t(i)] += av[size_t(ta ? p * m + i : i * k + p)];
          test::check_same_bits(from_vector(row_sums, {m}).to(dt), sums, name + ", op(a)'s row sums");
        }
    // A 16-bit c wider than a block of bf16 operands on weft's kernels (960 columns) and taller (2^20 / 960 rows).
    Tensor a = randn({1100, 5}, {.dtype = kBFloat16}, &gen), b = randn({5, 1000}, {.dtype = kBFloat16}, &gen);
    Tensor c0 = randn({1100, 1000}, {.dtype = kBFloat16}, &gen), want = c0.to(kFloat32), got = c0.clone();
    kernels::gemm(a.to(kFloat32), false, b.to(kFloat32), false, want, 0.5, 0.25);
    kernels::gemm(a, false, b, false, got, 0.5, 0.25);
    check(want.to(kBFloat16), got, fmt::format("{} kernel, c in four blocks", sgemm_kernel_name(kernel)));
    // beta 0 over a NaN-filled 16-bit c (k in one of the kernels' k blocks and in three): c is never read, every
    // element written once its sums are final.
    for (int64_t kk : {5, 700}) {
      Tensor x = randn({1100, kk}, {.dtype = kBFloat16}, &gen), y = randn({kk, 1000}, {.dtype = kBFloat16}, &gen);
      Tensor want32 = empty({1100, 1000}), got16 = full({1100, 1000}, std::nan(""), {.dtype = kBFloat16});
      kernels::gemm(x.to(kFloat32), false, y.to(kFloat32), false, want32, 0.5, 0.0);
      kernels::gemm(x, false, y, false, got16, 0.5, 0.0);
      check(want32.to(kBFloat16), got16, fmt::format("{} kernel, k {}, beta 0", sgemm_kernel_name(kernel), kk));
    }
  }
  set_sgemm_kernel(saved);
}
