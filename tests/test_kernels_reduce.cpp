// Tests for kernels/reduce: sum/mean/max/min/prod over any dims vs a double loop, strided
// inputs, result dtypes, f32 accuracy on long sums, max_dim/min_dim ties and NaN, var,
// sum_to, empty reductions, the parallel paths (the same bits on any thread count) and bad
// input.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/generator.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/threads.h"
#include "test_util.h"

using namespace weft;
using namespace weft::kernels;
using Catch::Contains;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using test::check_values;
using test::vec;

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
    case ReduceOp::sum_squares: return "sum_squares";
  }
  return "?";
}

// The reduction of x over dims, computed in double with a plain loop over every element.
std::vector<double> ref_reduce(ReduceOp op, const Tensor& x, const Shape& dims_in) {
  Shape shape = x.shape(), dims = normalize_dims(dims_in, x.dim(), "ref");
  std::vector<bool> red(shape.size(), false);
  for (int64_t d : dims) red[size_t(d)] = true;
  int64_t n_out = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!red[d]) n_out *= shape[d];
  double init = op == ReduceOp::prod ? 1 : op == ReduceOp::max ? -INFINITY : op == ReduceOp::min ? INFINITY : 0;
  std::vector<double> acc(size_t(n_out), init), v = to_vector(x);
  std::vector<int64_t> count(size_t(n_out), 0);
  for (int64_t i = 0; i < int64_t(v.size()); ++i) {
    int64_t rem = i, o = 0, scale = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      int64_t idx = rem % shape[d];
      rem /= shape[d];
      if (!red[d]) o += idx * scale, scale *= shape[d];
    }
    double& a = acc[size_t(o)];
    double e = v[size_t(i)];
    ++count[size_t(o)];
    switch (op) {
      case ReduceOp::sum: case ReduceOp::mean: a += e; break;
      case ReduceOp::sum_squares: a += e * e; break;
      case ReduceOp::prod: a *= e; break;
      case ReduceOp::max: if (!std::isnan(a) && (std::isnan(e) || e > a)) a = e; break;
      case ReduceOp::min: if (!std::isnan(a) && (std::isnan(e) || e < a)) a = e; break;
    }
  }
  if (op == ReduceOp::mean)
    for (size_t o = 0; o < acc.size(); ++o) acc[o] /= double(count[o]);
  return acc;
}

}  // namespace

TEST_CASE("normalize_dims and reduced_shape") {
  CHECK(normalize_dims({}, 3, "sum") == Shape{0, 1, 2});
  CHECK(normalize_dims({-1, 0}, 3, "sum") == Shape{0, 2});
  CHECK(normalize_dims({}, 0, "sum") == Shape{});
  CHECK(normalize_dims({0}, 0, "sum") == Shape{});
  CHECK(reduced_shape({2, 3, 4}, {0, 2}, false) == Shape{3});
  CHECK(reduced_shape({2, 3, 4}, {0, 2}, true) == Shape{1, 3, 1});
  CHECK(reduced_shape({2, 3}, {0, 1}, false) == Shape{});
  CHECK_THROWS_WITH(normalize_dims({1, -1}, 2, "mean"), Contains("mean") && Contains("more than once"));
  CHECK_THROWS_WITH(normalize_dims({3}, 3, "sum"), Contains("sum") && Contains("dim 3"));
}

TEST_CASE("reductions of a small matrix: hand-computed values") {
  Tensor x = from_vector({1, -2, 3, 4, 5, -6}, {2, 3});
  check_values(reduce(ReduceOp::sum, x, {}, false), {5});
  check_values(reduce(ReduceOp::sum, x, {0}, false), {5, 3, -3});
  check_values(reduce(ReduceOp::sum, x, {1}, false), {2, 3});
  check_values(reduce(ReduceOp::mean, x, {1}, false), {2.0 / 3, 1});
  check_values(reduce(ReduceOp::max, x, {0}, false), {4, 5, 3});
  check_values(reduce(ReduceOp::min, x, {}, false), {-6});
  check_values(reduce(ReduceOp::prod, x, {1}, false), {-6, -120});
  Tensor k = reduce(ReduceOp::sum, x, {-1}, true);
  CHECK(k.shape() == Shape{2, 1});
  CHECK(reduce(ReduceOp::sum, x, {}, false).shape() == Shape{});
  CHECK(reduce(ReduceOp::sum, x, {}, true).shape() == Shape{1, 1});
  // A 0-dim tensor reduces to itself.
  check_values(reduce(ReduceOp::sum, scalar_tensor(2.5), {}, false), {2.5});
  check_values(reduce(ReduceOp::max, x, {0, 1}, false), {5});
}

TEST_CASE("reductions over every dim set match a double loop, for strided inputs too") {
  Generator gen(5);
  std::vector<Shape> shapes = {{5, 7, 3}, {64, 33}, {4, 1, 6, 2}, {1000}, {3, 40, 130}};
  for (const Shape& shape : shapes) {
    Tensor base = randn(shape, {}, &gen);
    std::vector<Tensor> inputs = {base};
    if (shape.size() >= 2) inputs.push_back(base.transpose(0, int64_t(shape.size()) - 1));
    if (shape.size() == 3) inputs.push_back(base.permute({1, 2, 0}));
    if (shape.size() >= 2) inputs.push_back(base.slice(0, 0, shape[0], 2));
    if (shape.size() == 2) inputs.push_back(base.select(1, 0).unsqueeze(1).expand({shape[0], 9}));
    for (const Tensor& x : inputs) {
      std::vector<Shape> dim_sets = {{}, {0}, {-1}};
      if (x.dim() >= 2) dim_sets.push_back({1});
      if (x.dim() >= 3) dim_sets.insert(dim_sets.end(), {{0, 2}, {0, 1}, {1, 2}});
      for (const Shape& dims : dim_sets) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
          for (bool keepdim : {false, true}) {
            INFO(op_name(op) << " of " << tensor_desc(x) << " strides " << shape_str(x.strides()) << " over "
                             << shape_str(dims) << " keepdim " << keepdim);
            Tensor r = reduce(op, x, dims, keepdim);
            CHECK(r.shape() == reduced_shape(x.shape(), normalize_dims(dims, x.dim(), "t"), keepdim));
            CHECK(r.dtype() == kFloat32);
            // f32 sums of hundreds of N(0, 1) values are good to ~1e-6 absolute, not relative.
            check_values(r, ref_reduce(op, x, dims), 2e-6, op == ReduceOp::sum ? 2e-5 : 1e-6);
          }
        }
      }
    }
  }
}

TEST_CASE("f32 sums of a million elements match double precision") {
  Generator gen(9);
  Tensor x = rand({1000000}, {}, &gen);
  double want = ref_reduce(ReduceOp::sum, x, {})[0];
  double got = reduce(ReduceOp::sum, x, {}, false).item();
  INFO("got " << got << " want " << want);
  CHECK(std::fabs(got - want) <= 1e-6 * std::fabs(want));
  // Column sums of a tall matrix (a bias gradient) and row sums of a wide one.
  Tensor m = rand({4096, 256}, {}, &gen);
  check_values(reduce(ReduceOp::sum, m, {0}, false), ref_reduce(ReduceOp::sum, m, {0}), 1e-6, 0);
  check_values(reduce(ReduceOp::mean, m, {0}, false), ref_reduce(ReduceOp::mean, m, {0}), 1e-6, 0);
  Tensor w = rand({4, 250000}, {}, &gen);
  check_values(reduce(ReduceOp::sum, w, {1}, false), ref_reduce(ReduceOp::sum, w, {1}), 1e-6, 0);
  // Few columns, many rows: the rows are split over threads.
  Tensor tall = rand({100000, 3}, {}, &gen);
  check_values(reduce(ReduceOp::sum, tall, {0}, false), ref_reduce(ReduceOp::sum, tall, {0}), 1e-6, 0);
  check_values(reduce(ReduceOp::max, tall, {0}, false), ref_reduce(ReduceOp::max, tall, {0}));
  check_values(reduce(ReduceOp::min, w, {1}, false), ref_reduce(ReduceOp::min, w, {1}));
}

TEST_CASE("reductions over outer and inner dims at once (conv-style [N, C, H, W] -> [C])") {
  Generator gen(4);
  Tensor x = randn({16, 8, 32, 32}, {}, &gen);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min}) {
    INFO(op_name(op));
    check_values(reduce(op, x, {0, 2, 3}, false), ref_reduce(op, x, {0, 2, 3}), 1e-6, 1e-4);
  }
  Tensor s = sum_to(x, {8, 1, 1});
  CHECK(s.shape() == Shape{8, 1, 1});
  check_values(s, ref_reduce(ReduceOp::sum, x, {0, 2, 3}), 1e-6, 1e-4);
  Tensor y = randn({4, 6, 3, 5, 7}, {.dtype = kFloat64}, &gen);
  check_values(reduce(ReduceOp::sum, y, {1, 3, 4}, true), ref_reduce(ReduceOp::sum, y, {1, 3, 4}), 1e-12, 1e-12);
  check_values(reduce(ReduceOp::prod, y, {1, 4}, false), ref_reduce(ReduceOp::prod, y, {1, 4}), 1e-12, 1e-12);
  Tensor h = x.to(kBFloat16);
  check_values(reduce(ReduceOp::mean, h, {0, 2, 3}, false), ref_reduce(ReduceOp::mean, h, {0, 2, 3}), 1e-2, 1e-3);
}

TEST_CASE("parallel splits give the same results with more threads than outputs") {
  Generator gen(8);
  int before = get_num_threads();
  set_num_threads(4);
  Tensor x = randn({64, 2, 64, 64}, {}, &gen);
  check_values(reduce(ReduceOp::sum, x, {0, 2, 3}, false), ref_reduce(ReduceOp::sum, x, {0, 2, 3}), 1e-6, 1e-4);
  Tensor tall = randn({60000, 3}, {}, &gen);
  check_values(reduce(ReduceOp::max, tall, {0}, false), ref_reduce(ReduceOp::max, tall, {0}));
  Tensor row = randn({1, 100000}, {}, &gen);
  check_values(reduce(ReduceOp::sum, row, {1}, false), ref_reduce(ReduceOp::sum, row, {1}), 1e-6, 1e-4);
  std::vector<double> v(100000, 1.0);
  v[77777] = 5;
  v[88888] = 5;
  check_values(argmax(vec(v), 0, false), {77777});
  set_num_threads(before);
}

// Partial results combine in an order fixed by the shape, so 1 to 4 threads give the same bits.
// The shapes take each parallel path: many rows, a few long rows (split within a row), column
// tiles, few output columns over many rows (row slices), and runs of an [N, C, H, W] reduction.
TEST_CASE("reductions give the same bits on any number of threads") {
  Generator gen(12);
  struct Case {
    Shape shape, dims;
    DType dtype = kFloat32;
  };
  std::vector<Case> cases = {
      {{2000, 300}, {1}},        {{3, 200000}, {1}},         {{1000003}, {}},
      {{100000, 3}, {0}},        {{1, 50000, 40}, {1}},      {{4096, 512}, {0}},
      {{6, 3000, 200}, {1}},     {{64, 2, 64, 64}, {0, 2, 3}}, {{16, 8, 32, 32}, {0, 2, 3}},
      {{3, 200000}, {1}, kFloat64}, {{100000, 5}, {0}, kFloat64}, {{64, 2, 64, 64}, {0, 2, 3}, kFloat64},
      {{60000, 7}, {0}, kBFloat16},
  };
  for (const Case& c : cases) {
    Tensor x = randn(c.shape, {.dtype = c.dtype}, &gen);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::sum_squares}) {
      INFO(op_name(op) << " of " << tensor_desc(x) << " over " << shape_str(c.dims));
      test::check_same_bits_on_any_thread_count([&] { return std::vector<Tensor>{reduce(op, x, c.dims, false)}; });
    }
  }
  Tensor x = randn({3, 200000}, {}, &gen);
  test::check_same_bits_on_any_thread_count([&] {
    auto [values, indices] = max_dim(x, 1, false);
    return std::vector<Tensor>{values, indices};
  });
}

// Gradient clipping's squared norms: x^2 summed in f64 straight from x, the same bits as the sum
// of an f64 copy's squares (what clipping computed before), never an f32 sum.
TEST_CASE("sum_squares sums squares in f64: the bits of summing an f64 copy's squares") {
  Generator gen(31);
  for (DType dt : {kFloat32, kBFloat16, kFloat64}) {
    for (const Shape& shape : std::vector<Shape>{{1000003}, {300, 70}, {5, 7, 3}}) {
      // Values of very different sizes: an f32 sum of their squares loses the small ones.
      Tensor spread = unary(UnaryOp::exp, binary_scalar(BinaryOp::mul, randn(shape, {}, &gen), 4.0));
      Tensor x = binary(BinaryOp::mul, randn(shape, {}, &gen), spread).to(dt);
      Tensor x64 = x.to(kFloat64), sq = binary(BinaryOp::mul, x64, x64);
      for (const Shape& dims : std::vector<Shape>{{}, {0}, {-1}}) {
        INFO("sum_squares of " << tensor_desc(x) << " over " << shape_str(dims));
        Tensor r = reduce(ReduceOp::sum_squares, x, dims, false);
        CHECK(r.dtype() == kFloat64);
        check_values(r, to_vector(reduce(ReduceOp::sum, sq, dims, false)), 0, 0);  // equal, bit for bit
        check_values(r, ref_reduce(ReduceOp::sum_squares, x64, dims), 1e-10, 0);  // a serial sum of 10^6 terms
      }
    }
  }
  CHECK_THROWS_WITH(reduce(ReduceOp::sum_squares, ones({3}, {.dtype = kInt64}), {}, false),
                    Contains("sum_squares") && Contains("floating"));
}

TEST_CASE("result dtypes: integers sum to i64; 16-bit floats accumulate in f32") {
  Tensor b = from_vector({1, 0, 1, 1, 1, 0}, {2, 3}, {.dtype = kBool});
  Tensor s = reduce(ReduceOp::sum, b, {}, false);
  CHECK(s.dtype() == kInt64);
  check_values(s, {4});
  check_values(reduce(ReduceOp::sum, b, {0}, false), {2, 1, 1});
  CHECK(reduce(ReduceOp::max, b, {1}, false).dtype() == kBool);
  check_values(reduce(ReduceOp::max, b, {1}, false), {1, 1});
  check_values(reduce(ReduceOp::min, b, {1}, false), {0, 0});
  Tensor u = full({300}, 255, {.dtype = kUInt8});
  check_values(reduce(ReduceOp::sum, u, {}, false), {76500});
  Tensor i = from_vector({1, 2, 3, 4}, {2, 2}, {.dtype = kInt32});
  CHECK(reduce(ReduceOp::prod, i, {}, false).dtype() == kInt64);
  check_values(reduce(ReduceOp::prod, i, {}, false), {24});
  CHECK(reduce(ReduceOp::max, i, {}, false).dtype() == kInt32);
  check_values(reduce(ReduceOp::max, i.to(kInt64), {0}, false), {3, 4});
  Tensor big = full({3000000}, 1e6, {.dtype = kInt64});
  check_values(reduce(ReduceOp::sum, big, {}, false), {3e12});
  for (DType dt : {kBFloat16, kFloat16}) {
    INFO(dtype_name(dt));
    // 4096 ones: a 16-bit accumulator would get stuck at 256 (bf16) or 2048 (f16).
    Tensor o = ones({4096}, {.dtype = dt});
    Tensor so = reduce(ReduceOp::sum, o, {}, false);
    CHECK(so.dtype() == dt);
    check_values(so, {4096});
    check_values(reduce(ReduceOp::sum, ones({4096, 3}, {.dtype = dt}), {0}, false), {4096, 4096, 4096});
    check_values(reduce(ReduceOp::mean, from_vector({1, 2, 3, 6}, {2, 2}, {.dtype = dt}), {1}, false), {1.5, 4.5});
    check_values(reduce(ReduceOp::max, from_vector({1, -2, 3, 6}, {2, 2}, {.dtype = dt}), {0}, false), {3, 6});
  }
  Tensor d = from_vector({1e-3, 1, 1e3, 1e6}, {4}, {.dtype = kFloat64});
  check_values(reduce(ReduceOp::sum, d, {}, false), {1001001.001}, 1e-15, 0);
}

TEST_CASE("max and min propagate NaN") {
  Tensor x = from_vector({1, kNaN, 3, 4, 5, 6}, {2, 3});
  check_values(reduce(ReduceOp::max, x, {}, false), {kNaN});
  check_values(reduce(ReduceOp::min, x, {1}, false), {kNaN, 4});
  check_values(reduce(ReduceOp::max, x, {0}, false), {4, kNaN, 6});
  std::vector<double> long_row(1000, 1.0);
  long_row[700] = kNaN;
  check_values(reduce(ReduceOp::max, vec(long_row), {}, false), {kNaN});
}

TEST_CASE("max_dim and min_dim: values, first index on ties, NaN wins") {
  Tensor x = from_vector({1, 5, 5, 2, 7, 0, -1, 7}, {2, 4});
  auto [v, i] = max_dim(x, 1, false);
  check_values(v, {5, 7});
  check_values(i, {1, 0});
  CHECK(i.dtype() == kInt64);
  auto [v0, i0] = min_dim(x, 0, true);
  CHECK(v0.shape() == Shape{1, 4});
  check_values(v0, {1, 0, -1, 2});
  check_values(i0, {0, 1, 1, 0});
  check_values(argmax(x, 0, false), {1, 0, 0, 1});
  check_values(argmin(x, -1, false), {0, 2});
  // NaN beats everything; the first NaN's index is returned.
  auto [vn, in] = max_dim(from_vector({1, kNaN, 3, kNaN}, {4}), 0, false);
  check_values(vn, {kNaN});
  check_values(in, {1});
  check_values(argmin(from_vector({1, 0, kNaN, 0}, {2, 2}), 0, false), {1, 0});
  // Long rows (lane-parallel and thread-split paths): ties keep the first index.
  for (int64_t n : {40, 1000, 200000}) {
    INFO("row of " << n);
    std::vector<double> row(size_t(n), 0.0);
    row[size_t(n / 3)] = 9;
    row[size_t(n / 2)] = 9;
    row[size_t(n - 1)] = -9;
    row[size_t(n - 2)] = -9;
    check_values(argmax(vec(row), 0, false), {double(n / 3)});
    check_values(argmin(vec(row), 0, false), {double(n - 2)});
    row[size_t(n / 2 + 1)] = kNaN;
    check_values(argmax(vec(row), 0, false), {double(n / 2 + 1)});
    check_values(argmax(vec(row, kBFloat16), 0, false), {double(n / 2 + 1)});
  }
  // Random data in both layouts vs a plain loop, with a transposed view.
  Generator gen(2);
  Tensor r = randn({37, 300}, {}, &gen);
  for (const Tensor& t : {r, r.t()}) {
    for (int64_t dim : {0, 1}) {
      INFO(tensor_desc(t) << " dim " << dim);
      auto [mv, mi] = max_dim(t, dim, false);
      std::vector<double> vals = to_vector(t), wv, wi;
      int64_t rows = t.size(0), cols = t.size(1);
      int64_t n_out = dim == 0 ? cols : rows, n_red = dim == 0 ? rows : cols;
      for (int64_t o = 0; o < n_out; ++o) {
        double best = -INFINITY;
        int64_t bi = 0;
        for (int64_t k = 0; k < n_red; ++k) {
          double e = dim == 0 ? vals[size_t(k * cols + o)] : vals[size_t(o * cols + k)];
          if (e > best) best = e, bi = k;
        }
        wv.push_back(best);
        wi.push_back(double(bi));
      }
      check_values(mv, wv, 0, 0);
      check_values(mi, wi, 0, 0);
    }
  }
  check_values(argmax(from_vector({3, 1, 2}, {3}, {.dtype = kInt64}), 0, false), {0});
  check_values(argmax(from_vector({0, 1, 1}, {3}, {.dtype = kBool}), 0, false), {1});
}

TEST_CASE("var with correction") {
  Tensor x = from_vector({1, 2, 3, 4, 10, 20, 30, 40}, {2, 4});
  check_values(var(x, {1}, 1, false), {5.0 / 3, 500.0 / 3});
  check_values(var(x, {1}, 0, false), {1.25, 125});
  check_values(var(x, {0}, 1, true), {40.5, 162, 364.5, 648});
  CHECK(var(x, {0}, 1, true).shape() == Shape{1, 4});
  double mean_all = 13.75, ss = 0;
  for (double v : to_vector(x)) ss += (v - mean_all) * (v - mean_all);
  check_values(var(x, {}, 1, false), {ss / 7});
  check_values(var(vec({3}), {}, 1, false), {kNaN});  // 0/0, as torch.var of one element
  Tensor h = var(x.to(kBFloat16), {1}, 1, false);
  CHECK(h.dtype() == kBFloat16);
  check_values(h, {5.0 / 3, 500.0 / 3}, 1e-2);
  // Large offset: the two-pass form keeps the small variance.
  check_values(var(vec({1e4 + 1, 1e4 + 2, 1e4 + 3}), {}, 1, false), {1}, 1e-4);
  // Equal values: exactly 0 (an f32 mean an ulp off had given 4.5e-11), each row on its own.
  for (double value : {11.11, 57219.5}) {
    check_values(var(full({768}, value), {}, 0, false), {0}, 0, 0);
    check_values(var(full({2, 768}, value), {1}, 0, false), {0, 0}, 0, 0);
  }
}

TEST_CASE("sum_to undoes broadcasting") {
  Tensor x = arange(0, 24).view({2, 3, 4});
  Tensor a = sum_to(x, {3, 1});
  CHECK(a.shape() == Shape{3, 1});
  check_values(a, ref_reduce(ReduceOp::sum, x, {0, 2}));
  check_values(sum_to(x, {4}), ref_reduce(ReduceOp::sum, x, {0, 1}));
  check_values(sum_to(x, {1, 3, 4}), ref_reduce(ReduceOp::sum, x, {0}));
  Tensor s = sum_to(x, {});
  CHECK(s.shape() == Shape{});
  check_values(s, {276});
  CHECK(sum_to(x, {2, 3, 4}).is_same(x));
  // a bias gradient: [N, D] -> [D]
  Tensor g = ones({1000, 48});
  check_values(sum_to(g, {48}), std::vector<double>(48, 1000));
  CHECK_THROWS_WITH(sum_to(x, {5, 4}), Contains("sum_to"));
  CHECK_THROWS_WITH(sum_to(x, {1, 2, 3, 4}), Contains("sum_to") && Contains("[1, 2, 3, 4]"));
  CHECK_THROWS_WITH(sum_to(x, {3, 3, 4}), Contains("sum_to") && Contains("[3, 3, 4]"));
}

TEST_CASE("empty reductions") {
  Tensor e = zeros({0, 3});
  check_values(reduce(ReduceOp::sum, e, {0}, false), {0, 0, 0});
  check_values(reduce(ReduceOp::prod, e, {0}, false), {1, 1, 1});
  check_values(reduce(ReduceOp::mean, e, {0}, false), {kNaN, kNaN, kNaN});
  CHECK(reduce(ReduceOp::max, e, {1}, false).shape() == Shape{0});  // nothing to reduce into
  CHECK(reduce(ReduceOp::sum, zeros({0}, {.dtype = kInt32}), {}, false).item() == 0);
  CHECK_THROWS_WITH(reduce(ReduceOp::max, e, {0}, false), Contains("max") && Contains("no elements"));
  CHECK_THROWS_WITH(reduce(ReduceOp::min, e, {}, false), Contains("min"));
  CHECK_THROWS_WITH(max_dim(e, 0, false), Contains("max_dim") && Contains("empty"));
}

TEST_CASE("reductions reject bad input with messages naming the op") {
  Tensor x = ones({2, 3});
  float buf[4] = {1, 2, 3, 4};
  Tensor on_gpu = from_blob(buf, {4}, kFloat32, Device::cuda(0));
  CHECK_THROWS_AS(reduce(ReduceOp::sum, x, {2}, false), weft::Error);
  CHECK_THROWS_AS(max_dim(zeros({0}), 0, false), weft::Error);
  CHECK_THROWS_WITH(reduce(ReduceOp::sum, x, {2}, false), Contains("sum") && Contains("dim 2"));
  CHECK_THROWS_WITH(reduce(ReduceOp::mean, x, {0, 0}, false), Contains("mean") && Contains("more than once"));
  if (!test::cuda_usable()) {  // the message depends on whether weft was built with CUDA
    CHECK_THROWS_WITH(reduce(ReduceOp::sum, on_gpu, {}, false),
                      Contains("sum") && (Contains("no kernels for device cuda:0") || Contains("no CUDA device is visible")));
    CHECK_THROWS_WITH(max_dim(on_gpu, 0, false), Contains("max_dim") && Contains("cuda:0"));
  }
  CHECK_THROWS_WITH(reduce(ReduceOp::prod, Tensor(), {}, false), Contains("prod") && Contains("undefined"));
  CHECK_THROWS_WITH(var(ones({3}, {.dtype = kInt64}), {}, 1, false), Contains("var") && Contains("floating"));
  // mean (and var) of an integer or bool tensor has no dtype to return, as in PyTorch; convert it first.
  for (DType dt : {kInt64, kInt32, kUInt8, kBool}) {
    CHECK_THROWS_WITH(reduce(ReduceOp::mean, ones({2, 3}, {.dtype = dt}), {1}, false),
                      Contains("mean") && Contains(std::string(dtype_name(dt)) + "[2, 3]") && Contains("floating"));
    CHECK_THROWS_WITH(var(ones({3}, {.dtype = dt}), {}, 1, false),
                      Contains("var") && Contains(std::string(dtype_name(dt))));
  }
  CHECK_THROWS_WITH(argmin(x, -3, false), Contains("min_dim") && Contains("-3"));
  CHECK_THROWS_WITH(sum_to(Tensor(), {1}), Contains("sum_to") && Contains("undefined"));
}
