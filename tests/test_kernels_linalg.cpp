// Tests for kernels/linalg: matmul against a naive double-precision triple loop for every
// shape rule (1-D, 2-D, batched with broadcast), with transposed, sliced and strided
// operands, in f32/f64/bf16/f16; gemm's alpha/beta/transposes; and the errors.
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <cmath>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/linalg.h"
#include "kernels/threads.h"

using namespace weft;

namespace {

Generator gen(1234);

Tensor rnd(const Shape& shape, DType dtype = kFloat32) { return randn(shape, {.dtype = dtype}, &gen); }

// Fails listing the first few elements that differ by more than tol (relative to 1 + |want|).
void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i]))) continue;
    if (bad++ < 6) report += fmt::format("  [{}] got {} want {}\n", i, got[i], want[i]);
  }
  INFO(fmt::format("{} of {} elements differ:\n{}", bad, got.size(), report));
  CHECK(bad == 0);
}

// torch.matmul's rules, written out naively in double.
std::pair<Shape, std::vector<double>> ref_matmul(const Tensor& a, const Tensor& b) {
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a, b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                 Shape(b2.shape().begin(), b2.shape().end() - 2), "ref");
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  std::vector<double> va = to_vector(a2.expand(sa)), vb = to_vector(b2.expand(sb));
  int64_t nb = shape_numel(batch);
  std::vector<double> out(size_t(nb * m * n), 0.0);
  for (int64_t t = 0; t < nb; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) s += va[(t * m + i) * k + p] * vb[(t * k + p) * n + j];
        out[(t * m + i) * n + j] = s;
      }
  Shape shape = batch;
  if (a.dim() > 1) shape.push_back(m);
  if (b.dim() > 1) shape.push_back(n);
  return {shape, out};
}

void check_matmul(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  INFO("a " << tensor_desc(a) << " strides " << shape_str(a.strides()) << ", b " << tensor_desc(b)
            << " strides " << shape_str(b.strides()));
  Tensor c = kernels::matmul(a, b);
  auto [shape, want] = ref_matmul(a, b);
  CHECK(c.shape() == shape);
  CHECK(c.dtype() == a.dtype());
  check_close(to_vector(c), want, tol);
}

}  // namespace

TEST_CASE("matmul of 2-D matrices matches a naive loop") {
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
             {1, 1, 1}, {2, 3, 4}, {1, 7, 5}, {6, 7, 1}, {37, 53, 29}, {64, 64, 64}, {5, 0, 3}, {0, 4, 3}})
      check_matmul(rnd({m, k}, dt), rnd({k, n}, dt), tol);
  }
}

TEST_CASE("matmul uses transposed and sliced operands in place or copies the rest") {
  int64_t m = 19, k = 23, n = 17;
  Tensor at = rnd({k, m}).t(), bt = rnd({n, k}).t();  // column-major views
  Tensor a = rnd({m, k}), b = rnd({k, n});
  check_matmul(at, b);
  check_matmul(a, bt);
  check_matmul(at, bt);
  check_matmul(rnd({m, 2 * k}).narrow(1, 3, k), rnd({k, 3 * n}).narrow(1, n, n));  // row-major, wide rows
  check_matmul(rnd({2 * k, m}).narrow(0, 5, k).t(), b);                            // column-major, wide
  check_matmul(rnd({m, 2 * k}).slice(1, 0, 2 * k, 2),
               rnd({k, 2 * n}).slice(1, 1, 2 * n, 2));                   // strided: copied
  check_matmul(rnd({1, k}).expand({m, k}), rnd({k, 1}).expand({k, n}));  // broadcast rows/cols
  check_matmul(rnd({k}).unsqueeze(0), b);                                // one row
}

TEST_CASE("matmul reads transposed and row-sliced operands without copying them") {
  Tensor a = rnd({64, 48}), b = rnd({40, 48}), x = rnd({4, 16, 3 * 48});
  auto extra_bytes = [](auto&& fn) {  // bytes allocated beyond the result
    int64_t before = memory_stats().live_bytes;
    reset_peak_memory_stats();
    Tensor out = fn();
    return memory_stats().peak_bytes - before - int64_t(out.nbytes());
  };
  CHECK(extra_bytes([&] { return kernels::matmul(a, b.t()); }) == 0);
  CHECK(extra_bytes([&] { return kernels::matmul(b.t().t(), a.t()); }) == 0);
  CHECK(extra_bytes([&] { return kernels::matmul(x.narrow(2, 48, 48), b.t()); }) == 0);
  CHECK(extra_bytes(
            [&] { return kernels::matmul(x.narrow(2, 0, 48).transpose(1, 2), x.narrow(2, 96, 48)); }) == 0);
}

TEST_CASE("matmul follows the 1-D promotion rules") {
  check_matmul(rnd({7}), rnd({7}));                                          // dot -> 0-dim
  check_matmul(rnd({7}), rnd({7, 5}));                                       // [k] @ [k, n] -> [n]
  check_matmul(rnd({5, 7}), rnd({7}));                                       // [m, k] @ [k] -> [m]
  check_matmul(rnd({3, 5, 7}), rnd({7}));                                    // batched matrix-vector
  check_matmul(rnd({7}), rnd({2, 3, 7, 4}));                                 // vector-batched matrix
  check_matmul(rnd({14}).slice(0, 0, 14, 2), rnd({21}).slice(0, 0, 21, 3));  // strided dot
  Tensor d = kernels::matmul(from_vector({1, 2, 3}, {3}), from_vector({4, 5, 6}, {3}));
  CHECK(d.dim() == 0);
  CHECK(d.item() == 32.0);
}

TEST_CASE("batched matmul broadcasts batch dims") {
  check_matmul(rnd({2, 3, 5, 4}), rnd({3, 4, 6}));
  check_matmul(rnd({1, 5, 4}), rnd({4, 4, 6}));
  check_matmul(rnd({4, 1, 5, 4}), rnd({1, 3, 4, 6}));
  check_matmul(rnd({4, 5, 4}), rnd({4, 6}));                                     // folded into one GEMM
  check_matmul(rnd({3, 4}), rnd({2, 4, 6}));                                     // 2-D @ batched
  check_matmul(rnd({6, 4, 5}).transpose(1, 2), rnd({6, 6, 4}).transpose(1, 2));  // per-matrix transposes
  check_matmul(rnd({5, 3, 4}).transpose(0, 1), rnd({4, 6}));                     // batch dims not foldable
  check_matmul(rnd({3, 4, 6}).permute({2, 0, 1}).slice(0, 0, 6, 2), rnd({3, 4, 2}));
}

TEST_CASE("batched matmul of attention-shaped views") {
  // q and k sliced out of one fused projection [B, T, 3C], viewed as [B, H, T, hd].
  int64_t B = 2, T = 9, H = 3, hd = 4, C = H * hd;
  Tensor qkv = rnd({B, T, 3 * C});
  Tensor q = qkv.narrow(2, 0, C).view({B, T, H, hd}).transpose(1, 2);
  Tensor k = qkv.narrow(2, C, C).view({B, T, H, hd}).transpose(1, 2);
  check_matmul(q, k.transpose(2, 3));
  check_matmul(rnd({B, H, T, T}), k);
  // Many small GEMMs (split across the batch) and a few large ones (threaded inside).
  check_matmul(rnd({16, 32, 24}), rnd({16, 24, 20}));
  check_matmul(rnd({2, 150, 130}), rnd({2, 130, 170}), 1e-4);
  check_matmul(rnd({300, 200}), rnd({200, 250}), 1e-4);
}

TEST_CASE("matmul gives the same result with 1 and 2 threads") {
  Tensor a = rnd({8, 40, 64}), b = rnd({64, 48}), c = rnd({8, 64, 48});
  int saved = get_num_threads();
  set_num_threads(1);
  auto r1 = to_vector(kernels::matmul(a, b)), s1 = to_vector(kernels::matmul(a, c));
  set_num_threads(2);
  auto r2 = to_vector(kernels::matmul(a, b)), s2 = to_vector(kernels::matmul(a, c));
  set_num_threads(saved);
  check_close(r1, r2, 1e-6);
  check_close(s1, s2, 1e-6);
}

TEST_CASE("matmul of 16-bit floats computes in f32") {
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor a = rnd({2, 9, 33}).to(dt), b = rnd({33, 7}).to(dt).t().contiguous().t();
    Tensor c = kernels::matmul(a, b);
    CHECK(c.dtype() == dt);
    auto [shape, want] = ref_matmul(a, b);  // exact products of the rounded inputs
    CHECK(c.shape() == shape);
    check_close(to_vector(c), want, dt == kBFloat16 ? 1e-2 : 2e-3);
  }
}

TEST_CASE("gemm applies transposes, alpha and beta") {
  int64_t m = 6, k = 5, n = 4;
  Tensor a = rnd({k, m}, kFloat64), b = rnd({n, k}, kFloat64), c0 = rnd({m, n}, kFloat64);
  Tensor c = c0.clone();
  kernels::gemm(a, true, b, true, c, 2.0, 0.5);
  auto [shape, prod] = ref_matmul(a.t(), b.t());
  std::vector<double> c0v = to_vector(c0), want(prod.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2.0 * prod[i] + 0.5 * c0v[i];
  check_close(to_vector(c), want, 1e-12);

  // beta = 0 never reads out (NaN there must not leak).
  Tensor out = full({m, n}, std::nan(""), {.dtype = kFloat64});
  kernels::gemm(a.t().contiguous(), false, b, true, out);
  check_close(to_vector(out), prod, 1e-12);

  Tensor o32 = zeros({m, n}, {.dtype = kBFloat16});
  kernels::gemm(a.to(kBFloat16), true, b.to(kBFloat16), true, o32, 1.0, 1.0);
  check_close(to_vector(o32), prod, 3e-2);
}

TEST_CASE("matmul and gemm reject bad input with clear errors") {
  using Catch::Contains;
  CHECK_THROWS_WITH(kernels::matmul(rnd({3, 4}), rnd({5, 6})),
                    Contains("matmul") && Contains("[3, 4]") && Contains("[5, 6]"));
  CHECK_THROWS_WITH(kernels::matmul(rnd({2, 3, 4}), rnd({2, 5, 6})), Contains("inner dims"));
  CHECK_THROWS_WITH(kernels::matmul(rnd({3}), rnd({4})), Contains("matmul"));
  CHECK_THROWS_WITH(kernels::matmul(scalar_tensor(2.0), rnd({3})),
                    Contains("matmul") && Contains("at least 1 dim"));
  CHECK_THROWS_WITH(kernels::matmul(ones({2, 2}, {.dtype = kInt64}), ones({2, 2}, {.dtype = kInt64})),
                    Contains("matmul") && Contains("floating"));
  CHECK_THROWS_WITH(kernels::matmul(rnd({2, 2}), rnd({2, 2}, kFloat64)),
                    Contains("matmul") && Contains("dtypes"));
  CHECK_THROWS_WITH(kernels::matmul(rnd({2, 3, 4}), rnd({3, 4, 5})), Contains("matmul"));  // batch 2 vs 3
  CHECK_THROWS_WITH(kernels::matmul(rnd({2, 2}), Tensor()), Contains("matmul") && Contains("undefined"));
  Tensor out = zeros({4, 3}).t();
  CHECK_THROWS_WITH(kernels::gemm(rnd({3, 5}), false, rnd({5, 4}), false, out),
                    Contains("gemm") && Contains("contiguous"));
  CHECK_THROWS_WITH(kernels::gemm(rnd({3, 5}), true, rnd({5, 4}), false, zeros({3, 4})), Contains("gemm"));
}
