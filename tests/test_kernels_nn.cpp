// Tests for kernels/nn: forwards against naive double-precision loops, backwards against
// central finite differences of the forward in f64, index ops on hand-computed values,
// dropout's determinism and keep rate, layer norm and convolution backwards with the same bits
// on any thread count, and bad input that must raise weft::Error.
#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>

#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/elementwise.h"
#include "kernels/nn.h"
#include "kernels/threads.h"
#include "test_util.h"

using namespace weft;
namespace k = weft::kernels;
using Catch::Contains;
using Vec = std::vector<double>;

namespace {

Generator gen(99);
const double kInf = std::numeric_limits<double>::infinity();

Tensor rnd(const Shape& shape, DType dtype = kFloat64) { return randn(shape, {.dtype = dtype}, &gen); }
Tensor idx(const Vec& v, const Shape& shape, DType dtype = kInt64) {
  return from_vector(v, shape, {.dtype = dtype});
}

// Fails listing the first few elements that differ by more than tol (relative to 1 + |want|).
void check_close(const Vec& got, const Vec& want, double tol) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); ++i) {
    bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (same_inf || std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i]))) continue;
    if (bad++ < 6) report += fmt::format("  [{}] got {} want {}\n", i, got[i], want[i]);
  }
  INFO(fmt::format("{} of {} elements differ:\n{}", bad, got.size(), report));
  CHECK(bad == 0);
}
void check_close(const Tensor& got, const Vec& want, double tol) { check_close(to_vector(got), want, tol); }

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d f / d x by central differences; x is a contiguous f64 tensor perturbed in place.
Vec numeric_grad(const std::function<double()>& f, const Tensor& x, double h = 1e-6) {
  double* p = x.data<double>();
  Vec g(size_t(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    double keep = p[i];
    p[i] = keep + h;
    double up = f();
    p[i] = keep - h;
    double down = f();
    p[i] = keep;
    g[size_t(i)] = (up - down) / (2 * h);
  }
  return g;
}

// [outer, n, inner] around dim of a shape.
std::array<int64_t, 3> split(const Shape& s, int64_t dim) {
  std::array<int64_t, 3> r{1, 1, 1};
  for (int64_t d = 0; d < int64_t(s.size()); ++d) r[d < dim ? 0 : d == dim ? 1 : 2] *= s[d];
  return r;
}

Vec ref_softmax(const Tensor& x, int64_t dim, bool log) {
  Vec v = to_vector(x), out(v.size());
  auto [outer, n, inner] = split(x.shape(), dim);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&, n = n, inner = inner](int64_t i) { return size_t((o * n + i) * inner + j); };
      double mx = -kInf, sum = 0;
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, v[at(i)]);
      for (int64_t i = 0; i < n; ++i) sum += std::exp(v[at(i)] - mx);
      for (int64_t i = 0; i < n; ++i)
        out[at(i)] = log ? v[at(i)] - mx - std::log(sum) : std::exp(v[at(i)] - mx) / sum;
    }
  return out;
}

// y = layer_norm over the trailing `n` elements of each row.
Vec ref_layer_norm(const Vec& x, int64_t n, const Vec& w, const Vec& b, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mu += x[r * n + i];
    mu /= double(n);
    for (int64_t i = 0; i < n; ++i) var += (x[r * n + i] - mu) * (x[r * n + i] - mu);
    double rs = 1 / std::sqrt(var / double(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[r * n + i] = (x[r * n + i] - mu) * rs * (w.empty() ? 1.0 : w[i]) + (b.empty() ? 0.0 : b[i]);
  }
  return y;
}

// y = x / sqrt(mean(x^2) + eps) * w over the trailing `n` elements of each row.
Vec ref_rms_norm(const Vec& x, int64_t n, const Vec& w, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / size_t(n); ++r) {
    double sq = 0;
    for (int64_t i = 0; i < n; ++i) sq += x[r * n + i] * x[r * n + i];
    double rs = 1 / std::sqrt(sq / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * rs * (w.empty() ? 1.0 : w[i]);
  }
  return y;
}

// Per-row cross-entropy losses (0 for ignored rows) and the non-ignored count.
std::pair<Vec, int> ref_cross_entropy(const Vec& x, const Vec& t, int64_t c, int64_t ignore, double eps) {
  int64_t n = int64_t(t.size());
  Vec loss(size_t(n), 0.0);
  int count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (int64_t(t[i]) == ignore) continue;
    ++count;
    double mx = -kInf, sum = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, x[i * c + j]);
    for (int64_t j = 0; j < c; ++j) sum += std::exp(x[i * c + j] - mx);
    double lse = mx + std::log(sum), smooth = 0;
    for (int64_t j = 0; j < c; ++j) smooth += lse - x[i * c + j];
    loss[i] = (1 - eps) * (lse - x[i * c + int64_t(t[i])]) + eps * smooth / double(c);
  }
  return {loss, count};
}

Vec ref_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const k::Conv2dParams& p) {
  Vec xv = to_vector(x), wv = to_vector(w), bv = b.defined() ? to_vector(b) : Vec();
  int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), O = w.size(0), KH = w.size(2),
          KW = w.size(3);
  int64_t HO = (H + 2 * p.pad_h - KH) / p.stride_h + 1, WO = (W + 2 * p.pad_w - KW) / p.stride_w + 1;
  Vec out;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < HO; ++oh)
        for (int64_t ow = 0; ow < WO; ++ow) {
          double s = bv.empty() ? 0 : bv[o];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t i = 0; i < KH; ++i)
              for (int64_t j = 0; j < KW; ++j) {
                int64_t ih = oh * p.stride_h - p.pad_h + i, iw = ow * p.stride_w - p.pad_w + j;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                s += xv[((n * C + c) * H + ih) * W + iw] * wv[((o * C + c) * KH + i) * KW + j];
              }
          out.push_back(s);
        }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- softmax

TEST_CASE("the vectorised exp behind softmax is accurate on its domain") {
  double worst = 0;
  float worst_x = 0;
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    double rel = std::abs(double(k::cpu::fast_exp(x)) / std::exp(double(x)) - 1);
    if (rel > worst) worst = rel, worst_x = x;
  }
  INFO("worst relative error " << worst << " at x = " << worst_x);
  CHECK(worst < 4e-7);
  CHECK(k::cpu::fast_exp(0.0f) == 1.0f);
  CHECK(k::cpu::fast_exp(-100.0f) == Approx(std::exp(-100.0f)).epsilon(1e-3));  // subnormal, kept
  CHECK(k::cpu::fast_exp(-120.0f) == 0.0f);
  CHECK(k::cpu::fast_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isnan(k::cpu::fast_exp(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("softmax and log_softmax match a naive loop along every dim") {
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 2e-6 : 1e-12;
    for (const Shape& shape : {Shape{3, 4, 5}, Shape{70, 1003}, Shape{6, 300, 40}}) {
      Tensor x = rnd(shape, dt);
      for (int64_t dim = -1; dim < int64_t(shape.size()); ++dim) {
        INFO("dtype " << dtype_name(dt) << " shape " << shape_str(shape) << " dim " << dim);
        int64_t d = dim < 0 ? dim + int64_t(shape.size()) : dim;
        check_close(k::softmax(x, dim), ref_softmax(x, d, false), tol);
        check_close(k::log_softmax(x, dim), ref_softmax(x, d, true), tol);
      }
    }
    Tensor xt = rnd({3, 4, 5}, dt).transpose(0, 2);  // non-contiguous input
    check_close(k::softmax(xt, 1), ref_softmax(xt, 1, false), tol);
    check_close(k::log_softmax(xt, 2), ref_softmax(xt, 2, true), tol);
  }
}

TEST_CASE("softmax is stable for large inputs and gives exact zeros for -inf") {
  Tensor x = from_vector({1000, 1001, 1002, -kInf, 5, -kInf}, {2, 3});
  Vec e = {std::exp(-2.0), std::exp(-1.0), 1.0};
  double s = e[0] + e[1] + e[2];
  check_close(k::softmax(x, 1), {e[0] / s, e[1] / s, e[2] / s, 0, 1, 0}, 1e-6);
  check_close(k::log_softmax(x, 1), {-2 - std::log(s), -1 - std::log(s), -std::log(s), -kInf, 0, -kInf},
              1e-6);
  Vec y = to_vector(k::softmax(x, 1));
  CHECK(y[3] == 0.0);
  CHECK(y[5] == 0.0);
  CHECK(to_vector(k::softmax(scalar_tensor(3.0), 0)) == Vec{1.0});
}

TEST_CASE("softmax of 16-bit floats accumulates in f32") {
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor x = rnd({5, 300}).to(dt);
    Tensor y = k::softmax(x, -1);
    CHECK(y.dtype() == dt);
    check_close(y, ref_softmax(x, 1, false), dt == kBFloat16 ? 1e-2 : 2e-3);
    check_close(k::log_softmax(x, 0), ref_softmax(x, 0, true), dt == kBFloat16 ? 1e-2 : 2e-3);
  }
}

TEST_CASE("softmax backward matches finite differences") {
  for (auto [shape, dim] : std::vector<std::pair<Shape, int64_t>>{{{3, 5}, 1}, {{3, 5}, 0}, {{2, 3, 4}, 1}}) {
    for (bool log : {false, true}) {
      INFO("shape " << shape_str(shape) << " dim " << dim << (log ? " log_softmax" : " softmax"));
      Tensor x = rnd(shape), w = rnd(shape);
      auto fwd = [&, dim = dim] { return log ? k::log_softmax(x, dim) : k::softmax(x, dim); };
      Vec wv = to_vector(w);
      Vec num = numeric_grad([&] { return dot(wv, to_vector(fwd())); }, x);
      Tensor y = fwd();
      check_close(log ? k::log_softmax_backward(w, y, dim) : k::softmax_backward(w, y, dim), num, 1e-7);
    }
  }
  // The row and column paths of the f32 backward agree with the f64 one.
  Tensor x = rnd({40, 1000}), g = rnd({40, 1000});
  for (int64_t dim : {0, 1}) {
    Tensor y64 = k::softmax(x, dim), y32 = k::softmax(x.to(kFloat32), dim);
    check_close(k::softmax_backward(g.to(kFloat32), y32, dim), to_vector(k::softmax_backward(g, y64, dim)),
                1e-5);
    Tensor l64 = k::log_softmax(x, dim), l32 = k::log_softmax(x.to(kFloat32), dim);
    check_close(k::log_softmax_backward(g.to(kFloat32), l32, dim),
                to_vector(k::log_softmax_backward(g, l64, dim)), 1e-5);
  }
}

// ---------------------------------------------------------------- layer norm

TEST_CASE("layer_norm matches a naive loop and returns mean and rstd") {
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    Tensor x = rnd({4, 3, 70}, dt), w = rnd({70}, dt), b = rnd({70}, dt);
    auto [y, mean, rstd] = k::layer_norm(x, 1, w, b, 1e-5);
    CHECK(mean.dtype() == (dt == kFloat64 ? kFloat64 : kFloat32));
    CHECK(mean.shape() == Shape{4, 3});
    check_close(y, ref_layer_norm(to_vector(x), 70, to_vector(w), to_vector(b), 1e-5), tol);
    Vec xv = to_vector(x), mv = to_vector(mean), rv = to_vector(rstd);
    double mu = 0, var = 0;
    for (int i = 0; i < 70; ++i) mu += xv[70 + i] / 70;
    for (int i = 0; i < 70; ++i) var += (xv[70 + i] - mu) * (xv[70 + i] - mu) / 70;
    CHECK(mv[1] == Approx(mu).margin(1e-6));
    CHECK(rv[1] == Approx(1 / std::sqrt(var + 1e-5)).epsilon(1e-5));

    Tensor x2 = rnd({5, 4, 2}, dt).transpose(0, 2);  // [2, 4, 5], non-contiguous, two normalized dims
    check_close(std::get<0>(k::layer_norm(x2, 2, Tensor(), Tensor(), 1e-3)),
                ref_layer_norm(to_vector(x2), 20, {}, {}, 1e-3), tol);
    Tensor w2 = rnd({4, 5}, dt);
    check_close(std::get<0>(k::layer_norm(x2, 2, w2, Tensor(), 0.1)),
                ref_layer_norm(to_vector(x2), 20, to_vector(w2), {}, 0.1), tol);
  }
  Tensor xb = rnd({3, 64}).to(kBFloat16);
  check_close(std::get<0>(k::layer_norm(xb, 1, Tensor(), Tensor(), 1e-5)),
              ref_layer_norm(to_vector(xb), 64, {}, {}, 1e-5), 2e-2);
}

TEST_CASE("layer_norm of a row of equal values is its bias, at any eps; a variance past f32's range is NaN") {
  for (auto [value, n, eps] : {std::tuple{11.11, 768, 1e-12}, std::tuple{57219.5, 4096, 1e-5}, std::tuple{0.7, 1024, 1e-6}}) {
    INFO(value << " x " << n << ", eps " << eps);
    Tensor b = rnd({n}, kFloat32);
    Vec want = to_vector(b);
    want.insert(want.end(), want.begin(), want.end());
    check_close(std::get<0>(k::layer_norm(full({2, n}, value), 1, Tensor(), b, eps)), want, 0);
  }
  Tensor big = std::get<0>(k::layer_norm(from_vector({3e30, 1e30, 0}, {1, 3}), 1, Tensor(), Tensor(), 1e-6));
  for (double v : to_vector(big)) CHECK(std::isnan(v));  // 1 / sqrt(inf) had made it 0, silently
}

TEST_CASE("layer_norm backward matches finite differences") {
  for (int variant = 0; variant < 3; ++variant) {  // weight and bias, weight only, neither
    INFO("variant " << variant);
    Tensor x = rnd({3, 2, 5}), w = variant < 2 ? rnd({2, 5}) : Tensor(),
           b = variant == 0 ? rnd({2, 5}) : Tensor();
    Tensor g = rnd({3, 2, 5});
    Vec gv = to_vector(g);
    auto loss = [&] { return dot(gv, to_vector(std::get<0>(k::layer_norm(x, 2, w, b, 1e-5)))); };
    auto [y, mean, rstd] = k::layer_norm(x, 2, w, b, 1e-5);
    auto [dx, dw, db] = k::layer_norm_backward(g, x, mean, rstd, w, b, 2);
    check_close(dx, numeric_grad(loss, x), 1e-6);
    CHECK(dw.defined() == w.defined());
    CHECK(db.defined() == b.defined());
    if (w.defined()) check_close(dw, numeric_grad(loss, w), 1e-6);
    if (b.defined()) check_close(db, numeric_grad(loss, b), 1e-6);
  }
  // Many rows (threaded, per-thread partial sums): f32 agrees with f64.
  Tensor x = rnd({300, 128}), w = rnd({128}), b = rnd({128}), g = rnd({300, 128});
  auto [y, m, r] = k::layer_norm(x, 1, w, b, 1e-5);
  auto [dx, dw, db] = k::layer_norm_backward(g, x, m, r, w, b, 1);
  Tensor x32 = x.to(kFloat32), w32 = w.to(kFloat32), b32 = b.to(kFloat32);
  auto [y32, m32, r32] = k::layer_norm(x32, 1, w32, b32, 1e-5);
  auto [dx32, dw32, db32] = k::layer_norm_backward(g.to(kFloat32), x32, m32, r32, w32, b32, 1);
  check_close(dx32, to_vector(dx), 1e-4);
  check_close(dw32, to_vector(dw), 1e-4);
  check_close(db32, to_vector(db), 1e-4);
}

TEST_CASE("rms_norm matches a naive loop, centres nothing, and its backward matches finite differences") {
  for (DType dt : {kFloat32, kFloat64}) {
    double tol = dt == kFloat32 ? 1e-5 : 1e-12;
    // Rows with a large mean: layer norm would remove it, RMS norm must not.
    Tensor x = k::binary_scalar(k::BinaryOp::add, rnd({4, 3, 70}, dt), 3.0), w = rnd({70}, dt);
    auto [y, rstd] = k::rms_norm(x, 1, w, 1e-5);
    CHECK(rstd.dtype() == (dt == kFloat64 ? kFloat64 : kFloat32));
    CHECK(rstd.shape() == Shape{4, 3});
    check_close(y, ref_rms_norm(to_vector(x), 70, to_vector(w), 1e-5), tol);
    Tensor x2 = rnd({5, 4, 2}, dt).transpose(0, 2);  // non-contiguous, two normalized dims, no weight
    check_close(k::rms_norm(x2, 2, Tensor(), 0.1).first, ref_rms_norm(to_vector(x2), 20, {}, 0.1), tol);
  }
  for (bool affine : {true, false}) {
    INFO("weight " << affine);
    Tensor x = rnd({3, 2, 5}), w = affine ? rnd({2, 5}) : Tensor(), g = rnd({3, 2, 5});
    Vec gv = to_vector(g);
    auto loss = [&] { return dot(gv, to_vector(k::rms_norm(x, 2, w, 1e-5).first)); };
    auto [y, rstd] = k::rms_norm(x, 2, w, 1e-5);
    auto [dx, dw] = k::rms_norm_backward(g, x, rstd, w, 2);
    check_close(dx, numeric_grad(loss, x), 1e-6);
    CHECK(dw.defined() == affine);
    if (affine) check_close(dw, numeric_grad(loss, w), 1e-6);
  }
  // Many rows (threaded): f32 agrees with f64.
  Tensor x = rnd({300, 128}), w = rnd({128}), g = rnd({300, 128});
  auto [y, r] = k::rms_norm(x, 1, w, 1e-5);
  auto [dx, dw] = k::rms_norm_backward(g, x, r, w, 1);
  auto [y32, r32] = k::rms_norm(x.to(kFloat32), 1, w.to(kFloat32), 1e-5);
  auto [dx32, dw32] = k::rms_norm_backward(g.to(kFloat32), x.to(kFloat32), r32, w.to(kFloat32), 1);
  check_close(y32, to_vector(y), 1e-5);
  check_close(dx32, to_vector(dx), 1e-4);
  check_close(dw32, to_vector(dw), 1e-4);
  CHECK_THROWS_WITH(k::rms_norm(x, 1, rnd({3}), 1e-5), Contains("rms_norm"));
  CHECK_THROWS_WITH(k::rms_norm_backward(g, x, rnd({7}), w, 1), Contains("rms_norm_backward: saved statistics"));
}

// ---------------------------------------------------------------- cross-entropy

TEST_CASE("cross_entropy matches a naive loop for every reduction, ignore_index and smoothing") {
  int64_t n = 7, c = 5;
  Tensor logits = rnd({n, c});
  Vec t = {0, 4, -100, 2, 2, 1, 3};
  Vec xv = to_vector(logits);
  for (DType tdt : {kInt64, kInt32})
    for (double eps : {0.0, 0.1}) {
      INFO("target " << dtype_name(tdt) << " label_smoothing " << eps);
      Tensor target = idx(t, {n}, tdt);
      auto [rows, count] = ref_cross_entropy(xv, t, c, -100, eps);
      double sum = 0;
      for (double v : rows) sum += v;
      auto [none, st] = k::cross_entropy(logits, target, -100, eps, k::Reduction::none);
      CHECK(none.shape() == Shape{n});
      check_close(none, rows, 1e-12);
      Vec lp(xv.size()), sv = to_vector(st);  // log_softmax made again from the two numbers a row
      for (size_t i = 0; i < lp.size(); ++i) lp[i] = (xv[i] - sv[2 * (i / size_t(c))]) - sv[2 * (i / size_t(c)) + 1];
      check_close(lp, ref_softmax(logits, 1, true), 1e-12);
      check_close(k::cross_entropy(logits, target, -100, eps, k::Reduction::sum).first, {sum}, 1e-12);
      Tensor mean = k::cross_entropy(logits, target, -100, eps, k::Reduction::mean).first;
      CHECK(mean.dim() == 0);
      check_close(mean, {sum / count}, 1e-12);
      // A class index can be the ignored one too.
      Vec t2 = {0, 4, 1, 2, 2, 1, 3};
      auto [rows2, count2] = ref_cross_entropy(xv, t2, c, 2, eps);
      double sum2 = 0;
      for (double v : rows2) sum2 += v;
      check_close(k::cross_entropy(logits, idx(t2, {n}, tdt), 2, eps, k::Reduction::mean).first,
                  {sum2 / count2}, 1e-12);
    }
  // [C] logits with a scalar target.
  Tensor one = rnd({c});
  auto [l1, st1] = k::cross_entropy(one, idx({3}, {}), -100, 0.0, k::Reduction::mean);
  check_close(l1, ref_cross_entropy(to_vector(one), {3}, c, -100, 0.0).first, 1e-12);
  CHECK(st1.shape() == Shape{1, 2});
  CHECK(k::cross_entropy(one, idx({3}, {}), -100, 0.0, k::Reduction::none).first.dim() == 0);
  // Masked classes (logits at -inf, as vocabulary padding): the loss of the others, as PyTorch gives
  // (ln 2 for two equal classes left), inf when the target is masked, and with smoothing inf too.
  for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
    INFO("masked classes, " << dtype_name(dt));
    Tensor masked = from_vector({0, -kInf, 0, -kInf, 0, 1}, {2, 3}).to(dt);
    auto none = k::cross_entropy(masked, idx({0, 0}, {2}), -100, 0.0, k::Reduction::none).first;
    CHECK(std::abs(to_vector(none)[0] - std::log(2.0)) < 1e-2);
    CHECK(to_vector(none)[1] == kInf);
    CHECK(std::abs(k::cross_entropy(masked, idx({0, 2}, {2}), -100, 0.0, k::Reduction::mean).first.item() -
                   (std::log(2.0) + std::log1p(std::exp(-1.0))) / 2) < 1e-2);
    CHECK(k::cross_entropy(masked, idx({0, 2}, {2}), -100, 0.1, k::Reduction::mean).first.item() == kInf);
  }
  // Every target ignored: the mean is 0/0.
  CHECK(std::isnan(k::cross_entropy(logits, full({n}, -100, {.dtype = kInt64}), -100, 0.0, k::Reduction::mean)
                       .first.item()));
  // f32 and bf16 logits.
  check_close(k::cross_entropy(logits.to(kFloat32), idx(t, {n}), -100, 0.1, k::Reduction::none).first,
              ref_cross_entropy(xv, t, c, -100, 0.1).first, 1e-5);
  Tensor lb = logits.to(kBFloat16);
  check_close(k::cross_entropy(lb, idx(t, {n}), -100, 0.0, k::Reduction::none).first,
              ref_cross_entropy(to_vector(lb), t, c, -100, 0.0).first, 1e-5);
}

TEST_CASE("cross_entropy reads 16-bit logits as they are: f32 results as if widened first, dlogits in their dtype") {
  const int64_t n = 9, c = 300;
  Vec t = {0, 299, -100, 2, 2, 1, 3, 150, 7};
  for (DType dt : {kBFloat16, DType::f16})
    for (k::Reduction r : {k::Reduction::none, k::Reduction::mean, k::Reduction::sum})
      for (double eps : {0.0, 0.1}) {
        INFO(dtype_name(dt) << " reduction " << int(r) << " label_smoothing " << eps);
        Tensor x = rnd({n, c}).to(dt), wide = x.to(kFloat32), target = idx(t, {n});
        auto [loss, st] = k::cross_entropy(x, target, -100, eps, r);
        auto [loss32, st32] = k::cross_entropy(wide, target, -100, eps, r);
        REQUIRE(loss.dtype() == kFloat32);
        REQUIRE(st.dtype() == kFloat32);
        REQUIRE(st.shape() == Shape{n, 2});
        test::check_values(loss, to_vector(loss32), 1e-6, 0);  // the sums' order may differ in the last bit
        test::check_values(st, to_vector(st32), 1e-6, 1e-6);
        Tensor g = r == k::Reduction::none ? rnd({n}).to(kFloat32) : full({}, 0.75);
        Tensor d = k::cross_entropy_backward(g, x, st, target, -100, eps, r);
        REQUIRE(d.dtype() == dt);
        test::check_values(d, to_vector(k::cross_entropy_backward(g, wide, st32, target, -100, eps, r).to(dt)),
                           dt == kBFloat16 ? 1.0 / 128 : 1.0 / 1024, 1e-6);
      }
  Tensor x = rnd({2, 3}).to(kBFloat16);
  Tensor st = k::cross_entropy(x, idx({0, 1}, {2}), -100, 0.0, k::Reduction::mean).second;
  CHECK_THROWS_WITH(k::cross_entropy_backward(full({}, 1.0), x, st.to(kFloat64), idx({0, 1}, {2}), -100, 0.0,
                                              k::Reduction::mean),
                    Contains("row_stats") && Contains("want [2, 2] f32"));
  CHECK_THROWS_WITH(k::cross_entropy_backward(full({}, 1.0), x, st.narrow(0, 0, 1), idx({0, 1}, {2}), -100, 0.0,
                                              k::Reduction::mean),
                    Contains("row_stats") && Contains("want [2, 2] f32"));
}

// The backward makes each row's log-probabilities again from the logits and the forward's two
// numbers a row; they must be the ones the forward had: log_softmax's, to the last bits.
TEST_CASE("cross_entropy keeps two numbers a row, from which the backward's probabilities are the forward's") {
  const int64_t n = 6, c = 1000;
  Tensor x = rnd({n, c}).to(kFloat32), target = idx({0, 999, 5, 5, 17, 500}, {n});
  auto [loss, st] = k::cross_entropy(x, target, -100, 0.0, k::Reduction::sum);
  REQUIRE(st.shape() == Shape{n, 2});
  Vec xv = to_vector(x), sv = to_vector(st);
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, xv[size_t(i * c + j)]);
    for (int64_t j = 0; j < c; ++j) sum += std::exp(xv[size_t(i * c + j)] - mx);
    CHECK(sv[size_t(2 * i)] == mx);
    CHECK(sv[size_t(2 * i + 1)] == Approx(std::log(sum)).epsilon(1e-6));
  }
  // d loss / d x = softmax(x) - onehot: rows sum to 0, and the target's entry is p_t - 1.
  Tensor d = k::cross_entropy_backward(full({}, 1.0, {.dtype = kFloat32}), x, st, target, -100, 0.0,
                                       k::Reduction::sum);
  Vec dv = to_vector(d);
  for (int64_t i = 0; i < n; ++i) {
    double row = 0;
    for (int64_t j = 0; j < c; ++j) row += dv[size_t(i * c + j)];
    CHECK(row == Approx(0.0).margin(1e-5));
  }
  const Vec ref = ref_cross_entropy(xv, to_vector(target), c, -100, 0.0).first;  // -log p_t per row
  for (int64_t i = 0; i < n; ++i) {
    const size_t at = size_t(i * c + int64_t(to_vector(target)[size_t(i)]));
    CHECK(dv[at] == Approx(std::exp(-ref[size_t(i)]) - 1.0).epsilon(1e-5));
  }
}

TEST_CASE("cross_entropy backward matches finite differences") {
  int64_t n = 5, c = 4;
  Tensor target = idx({1, -100, 3, 0, 3}, {n});
  for (k::Reduction red : {k::Reduction::none, k::Reduction::sum, k::Reduction::mean})
    for (double eps : {0.0, 0.2}) {
      INFO("reduction " << int(red) << " label_smoothing " << eps);
      Tensor logits = rnd({n, c});
      Tensor g = red == k::Reduction::none ? rnd({n}) : scalar_tensor(0.7, {.dtype = kFloat64});
      Vec gv = to_vector(g);
      auto loss = [&] { return dot(gv, to_vector(k::cross_entropy(logits, target, -100, eps, red).first)); };
      auto [l, st] = k::cross_entropy(logits, target, -100, eps, red);
      Tensor d = k::cross_entropy_backward(g, logits, st, target, -100, eps, red);
      CHECK(d.shape() == Shape{n, c});
      check_close(d, numeric_grad(loss, logits), 1e-6);
      for (int64_t j = 0; j < c; ++j) CHECK(to_vector(d)[size_t(c + j)] == 0.0);  // ignored row
    }
}

// ---------------------------------------------------------------- embedding and indexing

TEST_CASE("embedding gathers rows and its backward accumulates repeated indices") {
  Tensor w = arange(0, 15, 1, {.dtype = kFloat32}).view({5, 3});
  for (DType dt : {kInt64, kInt32}) {
    Tensor i = idx({0, 4, 4, 1}, {2, 2}, dt);
    Tensor e = k::embedding(w, i);
    CHECK(e.shape() == Shape{2, 2, 3});
    CHECK(to_vector(e) == Vec{0, 1, 2, 12, 13, 14, 12, 13, 14, 3, 4, 5});
    Tensor g = arange(1, 13, 1, {.dtype = kFloat32}).view({2, 2, 3});
    Tensor dw = k::embedding_backward(g, i, 5);
    CHECK(dw.shape() == Shape{5, 3});
    CHECK(to_vector(dw) == Vec{1, 2, 3, 10, 11, 12, 0, 0, 0, 0, 0, 0, 4 + 7, 5 + 8, 6 + 9});
  }
  // Many tokens (vocabulary split across threads) against a serial sum.
  Tensor ids = idx(Vec(3000, 0.0), {3000});
  for (int64_t t = 0; t < 3000; ++t) ids.data<int64_t>()[t] = (t * 7919) % 50;
  Tensor g = rnd({3000, 32});
  Vec want(50 * 32, 0.0), gv = to_vector(g);
  for (int64_t t = 0; t < 3000; ++t)
    for (int64_t j = 0; j < 32; ++j) want[size_t((t * 7919) % 50 * 32 + j)] += gv[size_t(t * 32 + j)];
  check_close(k::embedding_backward(g, ids, 50), want, 1e-12);
  Tensor gb = g.to(kBFloat16);  // sums of the rounded gradients, rounded once at the end
  Vec wantb(50 * 32, 0.0), gbv = to_vector(gb);
  for (int64_t t = 0; t < 3000; ++t)
    for (int64_t j = 0; j < 32; ++j) wantb[size_t((t * 7919) % 50 * 32 + j)] += gbv[size_t(t * 32 + j)];
  check_close(k::embedding_backward(gb, ids, 50), wantb, 1e-2);
  CHECK_THROWS_WITH(k::embedding(w, idx({1, 5}, {2})),
                    Contains("embedding") && Contains("5") && Contains("5 embeddings"));
  CHECK_THROWS_WITH(k::embedding(w, idx({-1}, {1})), Contains("embedding") && Contains("index -1"));
}

TEST_CASE("index_select and index_add follow torch along any dim") {
  Tensor x = arange(0, 12, 1, {.dtype = kFloat32}).view({3, 4});
  CHECK(to_vector(k::index_select(x, 0, idx({2, 0, 2}, {3}))) == Vec{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(to_vector(k::index_select(x, 1, idx({3, 1}, {2}, kInt32))) == Vec{3, 1, 7, 5, 11, 9});
  CHECK(to_vector(k::index_select(x.t(), 0, idx({1}, {1}))) == Vec{1, 5, 9});  // non-contiguous input
  Tensor src = ones({3, 3});
  CHECK(to_vector(k::index_add({3, 4}, 1, idx({3, 0, 3}, {3}), src)) ==
        Vec{1, 0, 0, 2, 1, 0, 0, 2, 1, 0, 0, 2});
  Tensor s2 = arange(0, 6, 1, {.dtype = kFloat64}).view({2, 3});
  CHECK(to_vector(k::index_add({3, 3}, 0, idx({2, 2}, {2}), s2)) == Vec{0, 0, 0, 0, 0, 0, 3, 5, 7});
  Tensor xi = arange(0, 6, 1, {.dtype = kInt64}).view({2, 3});
  CHECK(to_vector(k::index_add({2, 2}, 1, idx({1, 1, 0}, {3}), xi)) == Vec{2, 1, 5, 7});
  CHECK_THROWS_WITH(k::index_select(x, 1, idx({4}, {1})), Contains("index_select") && Contains("index 4"));
  CHECK_THROWS_WITH(k::index_select(x, 0, idx({0, 1}, {1, 2})), Contains("index_select") && Contains("1-D"));
}

TEST_CASE("gather and scatter_add follow torch") {
  Tensor x = arange(0, 12, 1, {.dtype = kFloat32}).view({3, 4});
  Tensor i1 = idx({0, 0, 1, 3, 3, 2}, {3, 2});
  CHECK(to_vector(k::gather(x, 1, i1)) == Vec{0, 0, 5, 7, 11, 10});
  Tensor i0 = idx({2, 0, 1, 1, 0, 2}, {2, 3});
  CHECK(to_vector(k::gather(x, 0, i0)) == Vec{8, 1, 6, 4, 1, 10});
  CHECK(to_vector(k::gather(x.t(), 0, idx({1, 2}, {1, 2}))) == Vec{1, 6});  // strided input
  Tensor self = ones({3, 4});
  Tensor src = arange(1, 7, 1, {.dtype = kFloat32}).view({3, 2});
  CHECK(to_vector(k::scatter_add(self, 1, i1, src)) == Vec{4, 1, 1, 1, 1, 4, 1, 5, 1, 1, 7, 6});
  Tensor src0 = arange(1, 7, 1, {.dtype = kFloat32}).view({2, 3});
  CHECK(to_vector(k::scatter_add(zeros({3, 3}), 0, idx({2, 0, 2, 2, 1, 2}, {2, 3}), src0)) ==
        Vec{0, 2, 0, 0, 5, 0, 5, 0, 9});
  // scatter_add is gather's adjoint: <gather(x), g> == <x, scatter_add(0, g)>.
  Tensor xr = rnd({4, 5, 6}), ir = idx(Vec(4 * 3 * 6, 0.0), {4, 3, 6}), gr = rnd({4, 3, 6});
  for (int64_t t = 0; t < ir.numel(); ++t) ir.data<int64_t>()[t] = (t * 37) % 5;
  double lhs = dot(to_vector(k::gather(xr, 1, ir)), to_vector(gr));
  double rhs =
      dot(to_vector(xr), to_vector(k::scatter_add(zeros({4, 5, 6}, {.dtype = kFloat64}), 1, ir, gr)));
  CHECK(lhs == Approx(rhs).epsilon(1e-12));
  CHECK_THROWS_WITH(k::gather(x, 1, idx({4}, {1, 1})), Contains("gather") && Contains("index 4"));
  CHECK_THROWS_WITH(k::gather(x, 1, idx({0}, {1})), Contains("gather") && Contains("dims"));
  CHECK_THROWS_WITH(k::scatter_add(self, 0, idx({3}, {1, 1}), src),
                    Contains("scatter_add") && Contains("index 3"));
}

// ---------------------------------------------------------------- cat

TEST_CASE("cat joins along any dim, promotes dtypes and takes any strides") {
  Tensor a = arange(0, 6, 1, {.dtype = kFloat32}).view({2, 3}),
         b = arange(6, 10, 1, {.dtype = kFloat32}).view({2, 2});
  CHECK(to_vector(k::cat({a, b}, 1)) == Vec{0, 1, 2, 6, 7, 3, 4, 5, 8, 9});
  CHECK(to_vector(k::cat({a, a}, 0)) == Vec{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  CHECK(to_vector(k::cat({a.t(), b.t()}, 0)) == Vec{0, 3, 1, 4, 2, 5, 6, 8, 7, 9});  // strided inputs
  Tensor mixed = k::cat({a, ones({2, 1}, {.dtype = kInt64}), b.to(kFloat64)}, -1);
  CHECK(mixed.dtype() == kFloat64);
  CHECK(to_vector(mixed) == Vec{0, 1, 2, 1, 6, 7, 3, 4, 5, 1, 8, 9});
  CHECK(k::cat({a, ones({2, 1}, {.dtype = kInt32})}, 1).dtype() == kFloat32);
  CHECK(to_vector(k::cat({empty({0}), a}, 0)) == to_vector(a));  // legacy empty 1-D skipped
  Tensor big = rnd({64, 300});
  Tensor c = k::cat({big, big.narrow(1, 0, 100), big}, 1);
  CHECK(c.shape() == Shape{64, 700});
  CHECK(to_vector(c.narrow(1, 300, 100)) == to_vector(big.narrow(1, 0, 100)));
  CHECK(to_vector(c.narrow(1, 400, 300)) == to_vector(big));
  CHECK_THROWS_WITH(k::cat({a, b}, 0), Contains("cat") && Contains("tensor 1") && Contains("dim 1"));
  CHECK_THROWS_WITH(k::cat({}, 0), Contains("cat"));
  CHECK_THROWS_WITH(k::cat({a, ones({6})}, 0), Contains("cat") && Contains("dims"));
}

// ---------------------------------------------------------------- dropout

TEST_CASE("dropout is deterministic for a seed and keeps 1-p of the elements") {
  Tensor x = ones({200001});
  Generator g1(7), g2(7), g3(8);
  auto [y1, m1] = k::dropout(x, 0.3, &g1);
  auto [y2, m2] = k::dropout(x, 0.3, &g2);
  auto [y3, m3] = k::dropout(x, 0.3, &g3);
  Vec v1 = to_vector(y1), mv = to_vector(m1);
  CHECK(m1.dtype() == kBool);
  CHECK(v1 == to_vector(y2));
  CHECK(v1 != to_vector(y3));
  double kept = 0;
  bool consistent = true;
  for (size_t i = 0; i < v1.size(); ++i) {
    kept += mv[i];
    consistent &= v1[i] == (mv[i] != 0 ? float(1 / 0.7) : 0.0);
  }
  CHECK(consistent);
  CHECK(kept / double(v1.size()) == Approx(0.7).margin(0.005));
  // The mask does not depend on the thread count.
  int saved = get_num_threads();
  set_num_threads(1);
  Generator g4(7);
  CHECK(to_vector(k::dropout(x, 0.3, &g4).second) == mv);
  set_num_threads(saved);
  // Backward scales the kept gradients.
  Tensor g = rnd({200001}, kFloat32);
  Vec dv = to_vector(k::dropout_backward(g, m1, 0.3)), gv = to_vector(g);
  bool ok = true;
  for (size_t i = 0; i < dv.size(); ++i) ok &= std::abs(dv[i] - (mv[i] != 0 ? gv[i] / 0.7 : 0.0)) < 1e-5;
  CHECK(ok);
  CHECK(to_vector(k::dropout(x.narrow(0, 0, 10), 0.0, &g1).first) == Vec(10, 1.0));
  CHECK(to_vector(k::dropout(x.narrow(0, 0, 10), 1.0, &g1).first) == Vec(10, 0.0));
  CHECK_THROWS_WITH(k::dropout(x, 1.5, &g1), Contains("dropout") && Contains("1.5"));
  CHECK_THROWS_WITH(k::dropout(x, -0.1, &g1), Contains("dropout"));
}

TEST_CASE("dropout of a block of a whole tensor draws the whole's mask for its elements") {
  // The whole [4, 6, 10]; each block along each dim (a negative dim counts from the end) from the
  // same generator state gets the whole's mask there, and takes as many counters as the whole.
  Tensor whole = ones({4, 6, 10});
  Generator g(11);
  const Tensor want = k::dropout(whole, 0.5, &g).second;
  for (const auto& [dim, parts] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {-1, 5}, {2, 1}})
    for (int64_t index = 0; index < parts; ++index) {
      const int64_t n = whole.size(dim) / parts;
      Generator h(11);
      auto [y, mask] = k::dropout(whole.narrow(dim, index * n, n), 0.5, &h, {dim, parts, index});
      INFO("block " << index << " of " << parts << " along dim " << dim);
      CHECK(to_vector(mask) == to_vector(want.narrow(dim, index * n, n)));
      CHECK(h.offset() == g.offset());
    }
  Tensor part = ones({4, 3, 10});
  CHECK_THROWS_WITH(k::dropout(part, 0.5, &g, {1, 2, 2}), Contains("dropout: block 2 of 2 parts"));
  CHECK_THROWS_WITH(k::dropout(part, 0.5, &g, {1, 0, 0}), Contains("dropout: block 0 of 0 parts"));
  CHECK_THROWS_WITH(k::dropout(part, 0.5, &g, {3, 2, 0}), Contains("dropout (the block's dim)"));
}

// ---------------------------------------------------------------- convolution and pooling

TEST_CASE("conv2d matches a naive loop") {
  struct Case {
    Shape x, w;
    k::Conv2dParams p;
    bool bias;
  };
  std::vector<Case> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 2}, {2, 1, 1, 2}, true},   {{1, 2, 5, 5}, {3, 2, 5, 5}, {1, 1, 0, 0}, false},
      {{3, 4, 6, 5}, {5, 4, 1, 1}, {1, 1, 0, 0}, true},    // 1x1: no im2col
      {{8, 3, 12, 12}, {6, 3, 3, 3}, {1, 1, 1, 1}, true},  // images split across threads
      {{2, 1, 4, 4}, {2, 1, 3, 3}, {3, 3, 2, 2}, true},    // stride larger than kernel, big padding
  };
  for (DType dt : {kFloat64, kFloat32}) {
    for (const Case& c : cases) {
      INFO("x " << shape_str(c.x) << " w " << shape_str(c.w) << " dtype " << dtype_name(dt));
      Tensor x = rnd(c.x, dt), w = rnd(c.w, dt), b = c.bias ? rnd({c.w[0]}, dt) : Tensor();
      Tensor y = k::conv2d(x, w, b, c.p);
      check_close(y, ref_conv2d(x, w, b, c.p), dt == kFloat32 ? 1e-5 : 1e-12);
    }
  }
  Tensor x = rnd({2, 3, 6, 6}).to(kBFloat16), w = rnd({2, 3, 3, 3}).to(kBFloat16);
  Tensor y = k::conv2d(x, w, Tensor(), {});
  CHECK(y.dtype() == kBFloat16);
  check_close(y, ref_conv2d(x, w, Tensor(), {}), 3e-2);
  Tensor x3 = rnd({3, 5, 5});  // one image without the batch dim
  CHECK(k::conv2d(x3, rnd({2, 3, 3, 3}), Tensor(), {}).shape() == Shape{2, 3, 3});
}

TEST_CASE("conv2d backward matches finite differences") {
  struct Case {
    Shape x, w;
    k::Conv2dParams p;
    bool bias;
  };
  std::vector<Case> cases = {
      {{2, 2, 5, 4}, {3, 2, 3, 3}, {2, 1, 1, 1}, true},
      {{2, 3, 3, 3}, {2, 3, 1, 1}, {1, 1, 0, 0}, false},
      {{4, 2, 6, 6}, {3, 2, 3, 3}, {1, 1, 1, 1}, true},  // split across threads when there are 2+
  };
  for (const Case& c : cases) {
    INFO("x " << shape_str(c.x) << " w " << shape_str(c.w));
    Tensor x = rnd(c.x), w = rnd(c.w), b = c.bias ? rnd({c.w[0]}) : Tensor();
    Tensor y = k::conv2d(x, w, b, c.p), g = rnd(y.shape());
    Vec gv = to_vector(g);
    auto loss = [&] { return dot(gv, to_vector(k::conv2d(x, w, b, c.p))); };
    auto [dx, dw, db] = k::conv2d_backward(g, x, w, c.bias, c.p);
    check_close(dx, numeric_grad(loss, x), 1e-6);
    check_close(dw, numeric_grad(loss, w), 1e-6);
    CHECK(db.defined() == c.bias);
    if (c.bias) check_close(db, numeric_grad(loss, b), 1e-6);
  }
}

// dweight and dbias sum over rows (layer norm) or images (conv) in partials fixed by the shape,
// so 1 to 4 threads give the same bits.
TEST_CASE("layer_norm and conv2d backwards give the same bits on any number of threads") {
  for (DType dt : {kFloat32, kFloat64}) {
    INFO(dtype_name(dt));
    for (Shape shape : {Shape{3000, 96}, Shape{37, 4000}, Shape{5, 20000}}) {
      INFO("layer_norm of " << shape_str(shape));
      int64_t n = shape[1];
      Tensor x = rnd(shape, dt), w = rnd({n}, dt), b = rnd({n}, dt), g = rnd(shape, dt);
      auto [y, mean, rstd] = k::layer_norm(x, 1, w, b, 1e-5);
      test::check_same_bits_on_any_thread_count([&, mean = mean, rstd = rstd] {
        auto [dx, dw, db] = k::layer_norm_backward(g, x, mean, rstd, w, b, 1);
        return std::vector<Tensor>{dx, dw, db};
      });
    }
    struct Case {
      Shape x, w;
      k::Conv2dParams p;
    };
    std::vector<Case> cases = {
        {{13, 3, 16, 16}, {8, 3, 3, 3}, {1, 1, 1, 1}},   // images split across threads
        {{2, 16, 32, 32}, {32, 16, 3, 3}, {1, 1, 1, 1}},  // few images: each GEMM threaded
        {{9, 16, 12, 12}, {24, 16, 1, 1}, {1, 1, 0, 0}},  // 1x1: no im2col
    };
    for (const Case& c : cases) {
      INFO("conv2d of x " << shape_str(c.x) << " w " << shape_str(c.w));
      Tensor x = rnd(c.x, dt), w = rnd(c.w, dt);
      Tensor g = rnd(k::conv2d(x, w, Tensor(), c.p).shape(), dt);
      test::check_same_bits_on_any_thread_count([&] {
        auto [dx, dw, db] = k::conv2d_backward(g, x, w, true, c.p);
        return std::vector<Tensor>{dx, dw, db};
      });
    }
  }
}

TEST_CASE("max_pool2d picks window maxima, ignores padding and routes gradients back") {
  Tensor x = from_vector({1, 5, 2, 0,  //
                          3, 4, 9, 8,  //
                          7, 6, 1, 2},
                         {1, 1, 3, 4}, {.dtype = kFloat32});
  auto [y, i] = k::max_pool2d(x, {2, 2, 2, 2, 0, 0});
  CHECK(y.shape() == Shape{1, 1, 1, 2});
  CHECK(to_vector(y) == Vec{5, 9});
  CHECK(to_vector(i) == Vec{1, 6});
  auto [yp, ip] = k::max_pool2d(x, {3, 3, 2, 2, 1, 1});  // padding acts as -inf
  CHECK(to_vector(yp) == Vec{5, 9, 7, 9});
  CHECK(to_vector(ip) == Vec{1, 6, 8, 6});
  Tensor dx = k::max_pool2d_backward(ones({1, 1, 2, 2}), ip, x.shape());
  CHECK(to_vector(dx) == Vec{0, 1, 0, 0, 0, 0, 2, 0, 1, 0, 0, 0});  // overlapping windows add up
  Tensor neg = full({1, 2, 2}, -kInf);
  CHECK(to_vector(k::max_pool2d(neg, {2, 2, 2, 2, 1, 1}).first) == Vec(4, -kInf));

  // Random input against a naive loop, and the backward against finite differences.
  Tensor xr = rnd({2, 3, 7, 8});
  k::Pool2dParams p{3, 2, 2, 1, 1, 0};
  auto [yr, ir] = k::max_pool2d(xr, p);
  Vec xv = to_vector(xr), want;
  int64_t ho = (7 + 2 - 3) / 2 + 1, wo = (8 - 2) / 1 + 1;
  CHECK(yr.shape() == Shape{2, 3, ho, wo});
  for (int64_t c = 0; c < 6; ++c)
    for (int64_t oh = 0; oh < ho; ++oh)
      for (int64_t ow = 0; ow < wo; ++ow) {
        double m = -kInf;
        for (int64_t a = oh * 2 - 1; a < oh * 2 - 1 + 3; ++a)
          for (int64_t bb = ow; bb < ow + 2; ++bb)
            if (a >= 0 && a < 7) m = std::max(m, xv[size_t(c * 56 + a * 8 + bb)]);
        want.push_back(m);
      }
  check_close(yr, want, 0);
  Tensor g = rnd(yr.shape());
  Vec gv = to_vector(g);
  auto loss = [&] { return dot(gv, to_vector(k::max_pool2d(xr, p).first)); };
  check_close(k::max_pool2d_backward(g, ir, xr.shape()), numeric_grad(loss, xr), 1e-6);
}

// ---------------------------------------------------------------- errors

TEST_CASE("nn kernels reject bad input with errors naming the op") {
  Tensor x = rnd({2, 3}, kFloat32);
  CHECK_THROWS_WITH(k::softmax(ones({2, 2}, {.dtype = kInt64}), 0),
                    Contains("softmax") && Contains("floating"));
  CHECK_THROWS_WITH(k::log_softmax(x, 2), Contains("log_softmax"));
  CHECK_THROWS_WITH(k::softmax_backward(x, rnd({3, 2}, kFloat32), 0),
                    Contains("softmax_backward") && Contains("[3, 2]"));
  CHECK_THROWS_WITH(k::layer_norm(x, 1, rnd({2}, kFloat32), Tensor(), 1e-5),
                    Contains("layer_norm") && Contains("weight") && Contains("[3]"));
  CHECK_THROWS_WITH(k::layer_norm(x, 3, Tensor(), Tensor(), 1e-5),
                    Contains("layer_norm") && Contains("normalized_ndim"));
  CHECK_THROWS_WITH(k::cross_entropy(x, idx({1, 3}, {2}), -100, 0.0, k::Reduction::mean),
                    Contains("cross_entropy") && Contains("target 3") && Contains("3 classes"));
  CHECK_THROWS_WITH(k::cross_entropy(x, idx({1, 2, 0}, {3}), -100, 0.0, k::Reduction::mean),
                    Contains("cross_entropy") && Contains("[3]"));
  CHECK_THROWS_WITH(k::cross_entropy(x, idx({1, 2}, {2}), -100, 1.5, k::Reduction::sum),
                    Contains("cross_entropy") && Contains("label_smoothing"));
  CHECK_THROWS_WITH(k::cross_entropy(x, x, -100, 0.0, k::Reduction::sum),
                    Contains("cross_entropy") && Contains("i64"));
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 3, 5, 5}), rnd({2, 4, 3, 3}), Tensor(), {}),
                    Contains("conv2d") && Contains("[2, 4, 3, 3]"));
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 1, 2, 2}), rnd({1, 1, 3, 3}), Tensor(), {}),
                    Contains("conv2d") && Contains("smaller"));
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 1, 4, 4}), rnd({1, 1, 3, 3}), Tensor(), {0, 1, 0, 0}),
                    Contains("conv2d") && Contains("stride"));
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 1, 4, 4}), rnd({1, 1, 3, 3}), rnd({2}), {}),
                    Contains("conv2d") && Contains("bias"));
  CHECK_THROWS_WITH(k::max_pool2d(rnd({1, 1, 4, 4}), {2, 2, 2, 2, 2, 0}),
                    Contains("max_pool2d") && Contains("padding"));
  CHECK_THROWS_WITH(k::max_pool2d(rnd({4, 4}), {}), Contains("max_pool2d") && Contains("[4, 4]"));
  // An empty plane that padding would cover, padding past int64 when doubled, a window as wide.
  CHECK_THROWS_WITH(k::max_pool2d(rnd({1, 1, 0, 3}), {2, 2, 1, 1, 1, 1}), Contains("(H, W >= 1), got f64[1, 1, 0, 3]"));
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 1, 0, 3}), rnd({1, 1, 3, 3}), Tensor(), {1, 1, 2, 2}),
                    Contains("conv2d") && Contains("(H, W >= 1)"));
  const int64_t huge = int64_t(1) << 62;
  CHECK_THROWS_WITH(k::conv2d(rnd({1, 1, 4, 4}), rnd({1, 1, 3, 3}), Tensor(), {1, 1, huge, 0}),
                    Contains("conv2d") && Contains("padding in [0, 2^30]"));
  CHECK_THROWS_WITH(k::max_pool2d(rnd({1, 1, 4, 4}), {huge, 2, 1, 1, huge / 2, 0}),
                    Contains("max_pool2d") && Contains("kernel <= 2^30"));
  CHECK_THROWS_WITH(k::embedding(rnd({3}), idx({0}, {1})), Contains("embedding") && Contains("[V, D]"));
  CHECK_THROWS_WITH(k::embedding(rnd({3, 2}), x), Contains("embedding") && Contains("i64"));
  CHECK_THROWS_WITH(k::dropout_backward(x, ones({3, 2}, {.dtype = kBool}), 0.5),
                    Contains("dropout_backward"));
}
