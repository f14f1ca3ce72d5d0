// CUDA conformance: every op the CUDA backend implements, run on the same random inputs on
// the CPU and on cuda:0, outputs compared with a tolerance by dtype (the CPU backend is the
// reference; its own tests check it against exact math). Plus the runtime pieces that need a
// GPU: memory stats and the caching allocator on a device, streams, events, pinned copies.
// Without a CUDA build or a visible device it prints why and exits 77 (meson: SKIP).
//
// Adding an op: append a Case to the table in cases() (name, dtype, input makers, and a run
// function calling the public entry point on whatever device its inputs are on). Run one
// group with `test_cuda_conformance <substring>`, e.g. `test_cuda_conformance "binary add"`.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/copy.h"
#include "core/generator.h"
#include "core/op_profiler.h"
#include "core/stream.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/nn.h"
#include "kernels/optim.h"
#include "kernels/reduce.h"
#if WEFT_WITH_CUDA
#include "cuda/allocator.h"
#include "cuda/runtime.h"
#endif

using namespace weft;
using namespace weft::kernels;

namespace {

// ---------------------------------------------------------------- inputs

// How an input's values are drawn (so that e.g. log gets positive numbers).
enum class Values { normal, positive, nonzero, small_int, exponent, mask, index };

struct Input {
  Shape shape;
  DType dtype = DType::f32;
  Values values = Values::normal;
  bool transposed = false;  // pass a transposed view (strided input) of the last two dims
  int64_t limit = 0;        // Values::index: indices in [0, limit)
};

Tensor make_input(const Input& in, Generator& gen) {
  Shape shape = in.shape;
  if (in.transposed) std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) {
    switch (in.values) {
      case Values::normal: x = is_floating(in.dtype) ? 3.0 * (2 * gen.uniform() - 1) : std::floor(20 * gen.uniform()) - 10; break;
      case Values::positive: x = 0.1 + 3.0 * gen.uniform(); break;
      case Values::nonzero: x = (0.5 + 1.5 * gen.uniform()) * (gen.uniform() < 0.5 ? -1 : 1); break;
      case Values::small_int: x = std::floor(11 * gen.uniform()) - 5; break;
      case Values::exponent: x = std::floor(4 * gen.uniform()); break;
      case Values::mask: x = gen.uniform() < 0.5 ? 1 : 0; break;
      case Values::index: x = std::floor(double(in.limit) * gen.uniform()); break;
    }
    if (in.dtype == DType::u8) x = std::fabs(x);
    if (in.dtype == DType::bool_) x = x != 0 ? 1 : 0;
  }
  Tensor t = from_vector(v, shape, {.dtype = in.dtype});
  if (in.transposed) t = t.transpose(-1, -2);
  return t;
}

// ---------------------------------------------------------------- cases

using Run = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Case {
  std::string name;     // op and variant, e.g. "binary add"
  std::vector<Input> inputs;
  Run run;
  double tol_scale = 1;  // loosens the dtype tolerance for ops that amplify rounding
};

std::string shapes_str(const std::vector<Input>& inputs) {
  std::string s;
  for (const Input& in : inputs) {
    if (!s.empty()) s += " x ";
    s += shape_str(in.shape) + std::string(dtype_name(in.dtype)) + (in.transposed ? "(T)" : "");
  }
  return s;
}

// Relative tolerance of each output dtype: a few ulps of f32, a rounding step of 16-bit.
double tolerance(DType t) {
  switch (t) {
    case DType::f32: return 1e-5;
    case DType::f64: return 1e-12;
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    default: return 0;  // integers and bool: exact
  }
}

const std::vector<DType> kFloats = {DType::f32, DType::f64, DType::bf16, DType::f16};
const std::vector<DType> kInts = {DType::i64, DType::i32, DType::u8};
const std::vector<DType> kAll = {DType::f32, DType::f64, DType::bf16, DType::f16,
                                 DType::i64, DType::i32, DType::u8, DType::bool_};

std::vector<UnaryOp> all_unary() {
  std::vector<UnaryOp> ops;
  for (int i = 0; i <= int(UnaryOp::logical_not); ++i) ops.push_back(UnaryOp(i));
  return ops;
}
std::vector<BinaryOp> all_binary() {
  std::vector<BinaryOp> ops;
  for (int i = 0; i <= int(BinaryOp::logical_or); ++i) ops.push_back(BinaryOp(i));
  return ops;
}

Values unary_values(UnaryOp op) {
  switch (op) {
    case UnaryOp::log: case UnaryOp::sqrt: case UnaryOp::rsqrt: case UnaryOp::log1p: return Values::positive;
    case UnaryOp::reciprocal: return Values::nonzero;
    default: return Values::normal;
  }
}
bool unary_takes_integers(UnaryOp op) {
  return op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu || op == UnaryOp::square ||
         op == UnaryOp::sign || op == UnaryOp::logical_not;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  auto one = [](auto f) -> Run { return [f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x)}; }; };

  // ---- copies, conversions and factories
  for (DType from : kAll)
    for (DType to : kAll)
      // Negative floats have no u8 value (the conversion is undefined in C++): keep them positive.
      cs.push_back({"to dtype " + std::string(dtype_name(to)),
                    {{{9, 31}, from, to == DType::u8 && is_floating(from) ? Values::positive : Values::normal}},
                    one([to](const auto& x) { return x[0].to(to); })});
  for (DType t : kAll) {
    cs.push_back({"contiguous", {{{7, 5, 33}, t, Values::normal, true}}, one([](const auto& x) { return x[0].contiguous(); })});
    cs.push_back({"copy_ broadcast", {{{33}, t}}, one([](const auto& x) {
                    Tensor d = zeros({5, 33}, {.dtype = x[0].dtype(), .device = x[0].device()});
                    d.copy_(x[0]);
                    return d;
                  })});
    cs.push_back({"fill_", {{{4, 129}, t}}, one([](const auto& x) {
                    Tensor d = empty_like(x[0]);
                    d.fill_(1.75);
                    return d;
                  })});
    cs.push_back({"narrow copy_ into strided", {{{6, 10}, t}}, one([](const auto& x) {
                    Tensor d = zeros({6, 20}, {.dtype = x[0].dtype(), .device = x[0].device()});
                    d.narrow(1, 5, 10).copy_(x[0]);
                    return d;
                  })});
  }
  cs.push_back({"arange/zeros/ones/full", {{{1}, DType::f32}}, [](const auto& x) {
                  TensorOptions o{.dtype = DType::f32, .device = x[0].device()};
                  return std::vector<Tensor>{arange(-3, 7, 0.5, o), zeros({3, 4}, o), ones({5}, {.dtype = DType::bf16, .device = x[0].device()}),
                                             full({2, 3}, -2.5, {.dtype = DType::i64, .device = x[0].device()})};
                }});
  cs.push_back({"rand/randn (same generator)", {{{1}, DType::f32}}, [](const auto& x) {
                  Generator g(7);
                  TensorOptions o{.dtype = DType::f32, .device = x[0].device()};
                  return std::vector<Tensor>{rand({40, 3}, o, &g), randn({17}, o, &g)};
                }});

  // ---- unary and backward
  for (UnaryOp op : all_unary()) {
    std::string name = std::string("unary ") + unary_op_name(op);
    auto run = one([op](const auto& x) { return unary(op, x[0]); });
    if (op == UnaryOp::logical_not) {
      for (DType t : kAll) cs.push_back({name, {{{33, 65}, t, Values::mask}}, run});
      continue;
    }
    for (DType t : kFloats) {
      cs.push_back({name, {{{33, 65}, t, unary_values(op)}}, run});
      cs.push_back({name, {{{2, 33, 17}, t, unary_values(op), true}}, run});
    }
    if (unary_takes_integers(op))
      for (DType t : kInts) cs.push_back({name, {{{33, 65}, t, Values::normal}}, run});
    for (DType t : {DType::f32, DType::bf16, DType::f64}) {
      // grad, then x and y = op(x) (each op reads the one it needs).
      cs.push_back({"unary_backward " + std::string(unary_op_name(op)),
                    {{{19, 70}, t}, {{19, 70}, t, unary_values(op)}},
                    one([op](const auto& x) { return unary_backward(op, x[0], x[1], unary(op, x[1])); }),
                    op == UnaryOp::rsqrt || op == UnaryOp::reciprocal ? 4.0 : 1.0});
    }
  }

  // ---- binary, with broadcasting and scalars
  for (BinaryOp op : all_binary()) {
    std::string name = std::string("binary ") + binary_op_name(op);
    bool is_pow = op == BinaryOp::pow, is_div = op == BinaryOp::div;
    for (DType t : kAll) {
      if (t == DType::bool_ && (op == BinaryOp::sub || is_pow)) continue;
      bool fl = is_floating(t);
      Values a = is_pow ? (fl ? Values::positive : Values::small_int) : Values::normal;
      Values b = is_pow ? Values::exponent : is_div ? (fl ? Values::nonzero : Values::positive) : Values::normal;
      if (t == DType::u8 || t == DType::bool_) a = b = Values::mask;
      auto run = one([op](const auto& x) { return binary(op, x[0], x[1]); });
      cs.push_back({name, {{{17, 33}, t, a}, {{17, 33}, t, b}}, run});
      cs.push_back({name, {{{17, 33}, t, a}, {{33}, t, b}}, run});
      cs.push_back({name, {{{4, 1, 5}, t, a}, {{3, 1}, t, b}}, run});
      cs.push_back({name, {{{5, 9, 33}, t, a, true}, {{9, 33}, t, b, true}}, run});
      if (!is_pow || fl) {
        double s = is_pow ? 2.0 : is_div ? -1.5 : 1.25;
        if (!fl) s = is_pow ? 2 : 3;
        cs.push_back({"binary_scalar " + std::string(binary_op_name(op)), {{{17, 33}, t, a}},
                      [op, s](const auto& x) {
                        return std::vector<Tensor>{binary_scalar(op, x[0], s), binary_scalar(op, x[0], s, true)};
                      }});
      }
    }
    cs.push_back({name + " (promotes)", {{{17, 33}, DType::bf16}, {{33}, DType::f32, is_div ? Values::nonzero : Values::normal}},
                  one([op](const auto& x) { return binary(op, x[0], x[1]); })});
  }

  for (DType t : kFloats)  // SwiGLU's backward: the fused entry, strided (transposed) operands made contiguous
    cs.push_back({"swiglu_backward", {{{17, 33}, t}, {{17, 33}, t}, {{17, 33}, t, Values::normal, true}},
                  [](const auto& x) {
                    auto [dgate, dup] = swiglu_backward(x[0], x[1], x[2]);
                    return std::vector<Tensor>{dgate, dup};
                  }});

  // ---- in place, selection
  for (DType t : kAll) {
    if (t == DType::bool_) continue;
    double alpha = is_floating(t) ? -0.5 : 2;
    cs.push_back({"add_", {{{9, 33}, t}, {{33}, t}}, one([alpha](const auto& x) {
                    Tensor d = x[0].clone();
                    add_(d, x[1], alpha);
                    return d;
                  })});
    cs.push_back({"add_ into transposed", {{{9, 33}, t, Values::normal, true}, {{9, 33}, t}}, one([](const auto& x) {
                    Tensor d = x[0].clone().t();  // a strided destination
                    add_(d, x[1].t());
                    return d;
                  })});
    cs.push_back({"mul_scalar_", {{{9, 33}, t}}, one([alpha](const auto& x) {
                    Tensor d = x[0].clone();
                    mul_scalar_(d, alpha);
                    return d;
                  })});
    cs.push_back({"clamp", {{{9, 33}, t}}, [](const auto& x) {
                    return std::vector<Tensor>{clamp(x[0], -1.0, 2.0), clamp(x[0], std::nullopt, 0.5), clamp(x[0], 1.0, std::nullopt)};
                  }});
  }
  for (DType t : kAll) {
    cs.push_back({"where", {{{9, 33}, DType::bool_, Values::mask}, {{9, 33}, t}, {{33}, t}},
                  one([](const auto& x) { return where(x[0], x[1], x[2]); })});
    cs.push_back({"masked_fill", {{{9, 33}, t}, {{33}, DType::bool_, Values::mask}},
                  one([](const auto& x) { return masked_fill(x[0], x[1], x[0].dtype() == DType::u8 ? 7.0 : -1.0); })});
    cs.push_back({"masked_fill, a larger mask", {{{33}, t}, {{9, 33}, DType::bool_, Values::mask}},
                  one([](const auto& x) { return masked_fill(x[0], x[1], x[0].dtype() == DType::u8 ? 7.0 : -1.0); })});
  }

  // ---- reductions
  const std::vector<Shape> dim_sets = {{}, {0}, {1}, {2}, {0, 2}, {1, 2}};
  for (DType t : kAll) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
      if (op == ReduceOp::prod && t != DType::f64 && t != DType::i64) continue;  // overflow-prone elsewhere
      if (op == ReduceOp::mean && !is_floating(t)) continue;  // refused (tests/test_kernels_reduce.cpp)
      const char* names[] = {"sum", "mean", "max", "min", "prod"};
      for (const Shape& dims : dim_sets) {
        bool keep = dims.size() == 1;
        cs.push_back({std::string("reduce ") + names[int(op)] + " dims " + shape_str(dims),
                      {{{5, 7, 300}, t, op == ReduceOp::prod ? Values::exponent : Values::normal}},
                      one([op, dims, keep](const auto& x) { return reduce(op, x[0], dims, keep); }),
                      op == ReduceOp::mean || op == ReduceOp::sum ? 4.0 : 1.0});
      }
    }
    for (int64_t d : {0, 1, 2}) {
      cs.push_back({"max_dim/min_dim dim " + std::to_string(d), {{{5, 7, 300}, t, Values::small_int}},
                    [d](const auto& x) {
                      auto [v, i] = max_dim(x[0], d, false);
                      auto [w, j] = min_dim(x[0], d, true);
                      return std::vector<Tensor>{v, i, w, j};
                    }});
    }
  }
  cs.push_back({"reduce sum (strided input)", {{{40, 300}, DType::f32, Values::normal, true}},
                one([](const auto& x) { return reduce(ReduceOp::sum, x[0], {0}, false); })});
  cs.push_back({"var", {{{6, 500}, DType::f32}}, one([](const auto& x) { return var(x[0], {1}, 1, false); })});

  // ---- nn
  for (DType t : kAll) {
    cs.push_back({"cat dim 0", {{{3, 5}, t}, {{4, 5}, t}}, one([](const auto& x) { return cat({x[0], x[1]}, 0); })});
    cs.push_back({"cat dim 1 (strided)", {{{3, 5}, t, Values::normal, true}, {{3, 2}, t}},
                  one([](const auto& x) { return cat({x[0], x[1]}, 1); })});
  }
  cs.push_back({"cat (promotes)", {{{3, 5}, DType::bf16}, {{2, 5}, DType::f32}}, one([](const auto& x) { return cat({x[0], x[1]}, 0); })});
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (DType it : {DType::i64, DType::i32})
      cs.push_back({"embedding", {{{50, 24}, t}, {{7, 9}, it, Values::index, false, 50}},
                    one([](const auto& x) { return embedding(x[0], x[1]); })});
  // The index ops of indexing_backward.cu. Repeated indices (more positions than targets)
  // make the accumulating ones add several values into one element; those add atomically in
  // no fixed order on CUDA, and 16-bit ones add in f32 and round once where the CPU rounds
  // every add (hence tol_scale 2).
  for (DType t : kFloats)
    for (DType it : {DType::i64, DType::i32})
      cs.push_back({"embedding_backward", {{{7, 9, 24}, t}, {{7, 9}, it, Values::index, false, 50}},
                    one([](const auto& x) { return embedding_backward(x[0], x[1], 50); }), 2.0});
  for (DType t : kAll) {
    const double acc_tol = is_floating(t) ? 2.0 : 1.0;
    cs.push_back({"index_select dim 1", {{{5, 6, 7}, t}, {{9}, DType::i64, Values::index, false, 6}},
                  one([](const auto& x) { return index_select(x[0], 1, x[1]); })});
    cs.push_back({"index_select dim 0 (strided, i32 index)",
                  {{{6, 7}, t, Values::normal, true}, {{11}, DType::i32, Values::index, false, 6}},
                  one([](const auto& x) { return index_select(x[0], 0, x[1]); })});
    cs.push_back({"index_select dim -1", {{{5, 6, 7}, t}, {{4}, DType::i64, Values::index, false, 7}},
                  one([](const auto& x) { return index_select(x[0], -1, x[1]); })});
    cs.push_back({"index_add dim 1", {{{9}, DType::i64, Values::index, false, 6}, {{5, 9, 7}, t}},
                  one([](const auto& x) { return index_add({5, 6, 7}, 1, x[0], x[1]); }), acc_tol});
    cs.push_back({"index_add dim 0 (strided src, i32 index)",
                  {{{13}, DType::i32, Values::index, false, 4}, {{13, 6}, t, Values::normal, true}},
                  one([](const auto& x) { return index_add({4, 6}, 0, x[0], x[1]); }), acc_tol});
    cs.push_back({"gather dim 1", {{{5, 6, 7}, t}, {{5, 4, 7}, DType::i64, Values::index, false, 6}},
                  one([](const auto& x) { return gather(x[0], 1, x[1]); })});
    cs.push_back({"gather dim 0 (index larger along dim)", {{{5, 6, 7}, t}, {{8, 3, 7}, DType::i32, Values::index, false, 5}},
                  one([](const auto& x) { return gather(x[0], 0, x[1]); })});
    cs.push_back({"gather dim -1 (strided input)",
                  {{{5, 6, 7}, t, Values::normal, true}, {{4, 6, 9}, DType::i64, Values::index, false, 7}},
                  one([](const auto& x) { return gather(x[0], -1, x[1]); })});
    cs.push_back({"scatter_add dim 1",
                  {{{5, 6, 7}, t}, {{5, 9, 7}, DType::i64, Values::index, false, 6}, {{5, 9, 7}, t}},
                  one([](const auto& x) { return scatter_add(x[0], 1, x[1], x[2]); }), acc_tol});
    cs.push_back({"scatter_add dim 0 (src larger than index, i32 index)",
                  {{{4, 6, 7}, t}, {{9, 5, 6}, DType::i32, Values::index, false, 4}, {{10, 6, 7}, t}},
                  one([](const auto& x) { return scatter_add(x[0], 0, x[1], x[2]); }), acc_tol});
    cs.push_back({"scatter_add dim -1 (strided self and src)",
                  {{{5, 6, 7}, t, Values::normal, true}, {{5, 6, 11}, DType::i64, Values::index, false, 7},
                   {{5, 6, 11}, t, Values::normal, true}},
                  one([](const auto& x) { return scatter_add(x[0], -1, x[1], x[2]); }), acc_tol});
  }

  // ---- GEMM (cuBLASLt on CUDA). 16-bit products accumulate in f32 on both devices.
  auto mm = one([](const auto& x) { return matmul(x[0], x[1]); });
  for (DType t : kFloats) {
    cs.push_back({"matmul 2-D", {{{33, 65}, t}, {{65, 17}, t}}, mm});
    cs.push_back({"matmul 2-D (a^T)", {{{33, 65}, t, Values::normal, true}, {{65, 17}, t}}, mm});
    cs.push_back({"matmul 2-D (b^T)", {{{33, 65}, t}, {{65, 17}, t, Values::normal, true}}, mm});
    cs.push_back({"matmul 2-D (a^T b^T)", {{{33, 65}, t, Values::normal, true}, {{65, 17}, t, Values::normal, true}}, mm});
    cs.push_back({"matmul batched", {{{4, 33, 65}, t}, {{4, 65, 17}, t}}, mm});
    cs.push_back({"matmul batched (b^T)", {{{4, 33, 65}, t}, {{4, 65, 17}, t, Values::normal, true}}, mm});
    cs.push_back({"matmul rows @ 2-D (Linear)", {{{2, 3, 33, 65}, t}, {{65, 17}, t}}, mm});
    cs.push_back({"matmul 2-D @ batch (stride-0 a)", {{{33, 65}, t}, {{3, 65, 17}, t}}, mm});
    cs.push_back({"matmul broadcast batch dims", {{{3, 1, 9, 20}, t}, {{1, 4, 20, 7}, t}}, mm});
    cs.push_back({"matmul vector @ matrix", {{{65}, t}, {{65, 17}, t}}, mm});
    cs.push_back({"matmul matrix @ vector", {{{33, 65}, t}, {{65}, t}}, mm});
    cs.push_back({"matmul dot", {{{300}, t}, {{300}, t}}, mm, 4.0});
    cs.push_back({"gemm alpha beta trans", {{{65, 33}, t}, {{17, 65}, t}, {{33, 17}, t}}, one([](const auto& x) {
                    Tensor out = x[2].clone();
                    gemm(x[0], true, x[1], true, out, -0.75, 0.5);
                    return out;
                  })});
  }
  cs.push_back({"matmul sliced rows (qkv-like views)", {{{2, 9, 96}, DType::f32}, {{32, 20}, DType::f32}}, one([](const auto& x) {
                  return matmul(x[0].narrow(2, 32, 32), x[1]);  // rows strided by 96, unit columns
                })});
  cs.push_back({"matmul inner dim 0", {{{5, 0}, DType::f32}, {{0, 4}, DType::f32}}, mm});
  // TF32 (opt-in): inputs rounded to 10-bit mantissas; compared at ~3e-4 of the output's scale.
  cs.push_back({"matmul f32 with allow_tf32", {{{4, 33, 65}, DType::f32}, {{65, 17}, DType::f32}}, one([](const auto& x) {
                  bool before = allow_tf32();
                  set_allow_tf32(true);
                  Tensor r = matmul(x[0], x[1]);
                  set_allow_tf32(before);
                  return r;
                }), 300.0});

  // ---- softmax family, forward and backward, last and inner dims
  for (DType t : kFloats) {
    for (int64_t dim : {2, 1}) {
      std::string d = " dim " + std::to_string(dim);
      cs.push_back({"softmax + backward" + d, {{{4, 33, 70}, t}, {{4, 33, 70}, t}}, [dim](const auto& x) {
                      Tensor y = softmax(x[0], dim);
                      return std::vector<Tensor>{y, softmax_backward(x[1], y, dim)};
                    }, 2.0});
      cs.push_back({"log_softmax + backward" + d, {{{4, 33, 70}, t}, {{4, 33, 70}, t}}, [dim](const auto& x) {
                      Tensor y = log_softmax(x[0], dim);
                      return std::vector<Tensor>{y, log_softmax_backward(x[1], y, dim)};
                    }, 2.0});
    }
    cs.push_back({"softmax long rows", {{{3, 3000}, t}}, one([](const auto& x) { return softmax(x[0], -1); })});
  }

  // ---- layer norm with and without affine parameters, all gradients
  for (DType t : kFloats) {
    cs.push_back({"layer_norm + backward (affine)", {{{4, 7, 96}, t}, {{96}, t}, {{96}, t}, {{4, 7, 96}, t}},
                  [](const auto& x) {
                    auto [y, mean, rstd] = layer_norm(x[0], 1, x[1], x[2], 1e-5);
                    auto [dx, dw, db] = layer_norm_backward(x[3], x[0], mean, rstd, x[1], x[2], 1);
                    return std::vector<Tensor>{y, mean, rstd, dx, dw, db};
                  }, 4.0});
    cs.push_back({"layer_norm of rows of equal values, eps 1e-12: the bias", {{{3, 768}, t}, {{768}, t}}, [](const auto& x) {
                    Tensor c = binary_scalar(BinaryOp::add, binary_scalar(BinaryOp::mul, x[0], 0.0), 11.11);
                    return std::vector<Tensor>{std::get<0>(layer_norm(c, 1, Tensor(), x[1], 1e-12))};
                  }, 4.0});
    cs.push_back({"layer_norm + backward (2 dims, no affine)", {{{5, 6, 40}, t}, {{5, 6, 40}, t}}, [](const auto& x) {
                    auto [y, mean, rstd] = layer_norm(x[0], 2, Tensor(), Tensor(), 1e-5);
                    auto [dx, dw, db] = layer_norm_backward(x[1], x[0], mean, rstd, Tensor(), Tensor(), 2);
                    return std::vector<Tensor>{y, mean, rstd, dx};
                  }, 4.0});
    cs.push_back({"rms_norm + backward", {{{4, 7, 96}, t}, {{96}, t}, {{4, 7, 96}, t}}, [](const auto& x) {
                    auto [y, rstd] = rms_norm(x[0], 1, x[1], 1e-5);
                    auto [dx, dw] = rms_norm_backward(x[2], x[0], rstd, x[1], 1);
                    return std::vector<Tensor>{y, rstd, dx, dw};
                  }, 4.0});
  }

  // ---- cross-entropy: reductions, ignore_index (class 2 here), label smoothing, i32 targets
  for (DType t : kFloats)
    for (DType it : {DType::i64, DType::i32})
      for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none})
        for (double smooth : {0.0, 0.1}) {
          const char* rn = r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none";
          cs.push_back({std::string("cross_entropy + backward ") + rn + (smooth > 0 ? " smoothed" : ""),
                        {{{37, 10}, t}, {{37}, it, Values::index, false, 10}, {{r == Reduction::none ? 37 : 1}, t}},
                        [r, smooth](const auto& x) {
                          auto [loss, st] = cross_entropy(x[0], x[1], 2, smooth, r);
                          Tensor g = (r == Reduction::none ? x[2] : x[2].view({})).to(loss.dtype());  // f32 for 16-bit
                          return std::vector<Tensor>{loss, st,
                                                     cross_entropy_backward(g, x[0], st, x[1], 2, smooth, r)};
                        }, 4.0});
        }

  // ---- dropout: the CUDA mask is the CPU's (same counter-based hash of the seed), of a whole
  // tensor and of a block of one (the elements' indices in the whole)
  for (DType t : kFloats)
    cs.push_back({"dropout + backward", {{{9, 301}, t}, {{9, 301}, t}}, [](const auto& x) {
                    Generator g(5);
                    auto [y, mask] = dropout(x[0], 0.3, &g);
                    return std::vector<Tensor>{y, mask, dropout_backward(x[1], mask, 0.3)};
                  }});
  cs.push_back({"dropout of a block", {{{3, 5, 41}, DType::f32}}, [](const auto& x) {
                  Generator g(5);
                  auto [y, mask] = dropout(x[0], 0.3, &g, {1, 3, 2});
                  return std::vector<Tensor>{y, mask};
                }});

  // ---- conv2d (im2col + GEMM on CUDA) and max pooling
  for (DType t : {DType::f32, DType::f64, DType::bf16}) {
    struct ConvCase { const char* name; Shape w; Conv2dParams p; };
    for (const ConvCase& cc : {ConvCase{"3x3", {4, 3, 3, 3}, {}}, ConvCase{"3x3 stride 2 pad 1", {4, 3, 3, 3}, {2, 2, 1, 1}},
                               ConvCase{"1x1 direct", {5, 3, 1, 1}, {}}, ConvCase{"2x4 stride (1, 3) pad (0, 2)", {4, 3, 2, 4}, {1, 3, 0, 2}}}) {
      Shape out = {2, cc.w[0], (9 + 2 * cc.p.pad_h - cc.w[2]) / cc.p.stride_h + 1, (11 + 2 * cc.p.pad_w - cc.w[3]) / cc.p.stride_w + 1};
      Conv2dParams p = cc.p;
      cs.push_back({std::string("conv2d + backward ") + cc.name,
                    {{{2, 3, 9, 11}, t}, {cc.w, t}, {{cc.w[0]}, t}, {out, t}}, [p](const auto& x) {
                      Tensor y = conv2d(x[0], x[1], x[2], p);
                      auto [dx, dw, db] = conv2d_backward(x[3], x[0], x[1], true, p);
                      return std::vector<Tensor>{y, dx, dw, db};
                    }, 4.0});
    }
  }
  for (DType t : kFloats) {
    struct PoolCase { const char* name; Pool2dParams p; Shape out; };
    for (const PoolCase& pc : {PoolCase{"2x2", {}, {2, 3, 4, 5}}, PoolCase{"3x3 stride 2 pad 1 (overlapping)", {3, 3, 2, 2, 1, 1}, {2, 3, 5, 6}}}) {
      Pool2dParams p = pc.p;
      cs.push_back({std::string("max_pool2d + backward ") + pc.name, {{{2, 3, 9, 11}, t}, {pc.out, t}}, [p](const auto& x) {
                      auto [y, idx] = max_pool2d(x[0], p);
                      return std::vector<Tensor>{y, idx, max_pool2d_backward(x[1], idx, x[0].shape())};
                    }, 2.0});
    }
  }

  // ---- fused optimizers (f32/f64 master weights): the same operations in the same order
  for (DType t : {DType::f32, DType::f64}) {
    for (bool decoupled : {true, false})
      cs.push_back({decoupled ? "adamw step" : "adam step (L2)",
                    {{{7, 33}, t}, {{7, 33}, t}, {{7, 33}, t}, {{7, 33}, t, Values::positive}}, [decoupled](const auto& x) {
                      Tensor p = x[0].clone(), m = x[2].clone(), v = x[3].clone();
                      adam_step_(p, x[1], m, v, {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                                 .weight_decay = 0.1, .step = 3, .decoupled = decoupled,
                                                 .grad_scale = decoupled ? 0.37 : 1.0});
                      return std::vector<Tensor>{p, m, v};
                    }});
    for (bool nesterov : {false, true})
      for (bool first : {true, false})
        cs.push_back({std::string("sgd step momentum") + (nesterov ? " nesterov" : "") + (first ? " first" : ""),
                      {{{7, 33}, t}, {{7, 33}, t}, {{7, 33}, t}}, [nesterov, first](const auto& x) {
                        Tensor p = x[0].clone(), b = x[2].clone();
                        sgd_step_(p, x[1], b, {.lr = 0.05, .momentum = 0.9, .dampening = nesterov ? 0.0 : 0.1,
                                               .weight_decay = 0.01, .nesterov = nesterov, .first = first,
                                               .grad_scale = first ? 0.37 : 1.0});
                        return std::vector<Tensor>{p, b};
                      }});
    cs.push_back({"sgd step plain", {{{7, 33}, t}, {{7, 33}, t}}, [](const auto& x) {
                    Tensor p = x[0].clone();
                    sgd_step_(p, x[1], Tensor(), {.lr = 0.05, .momentum = 0, .dampening = 0, .weight_decay = 0,
                                                  .nesterov = false, .first = true});
                    return std::vector<Tensor>{p};
                  }});
  }

  // ---- fused attention (flash-style on CUDA), forward and backward, causal or not
  for (DType t : kFloats) {
    for (bool causal : {true, false}) {
      std::string c = causal ? " causal" : "";
      // q, k, v as head views of one fused [B, T, 3, H, E] projection: strided, unit last stride.
      // In bf16 a few of dQ's 6,720 values (2 to 5 on an H200 against AMX tiles) carry the
      // cancellation in dP - D at up to 0.05 on 0.2: 4x more room there; f32 holds the kernel to 4e-5.
      const double qkv_tol = t == DType::bf16 ? 16.0 : 4.0;
      cs.push_back({"attention + backward (qkv views)" + c, {{{2, 70, 3, 3, 16}, t}, {{2, 3, 70, 16}, t}},
                    [causal](const auto& x) {
                      Tensor qkv = x[0].permute({2, 0, 3, 1, 4});  // [3, B, H, T, E]
                      Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
                      auto [out, lse] = attention(q, k, v, causal, 0.25);
                      auto [dq, dk, dv] = attention_backward(x[1], q, k, v, out, lse, causal, 0.25);
                      return std::vector<Tensor>{out, lse, dq, dk, dv};
                    }, qkv_tol});
    }
    // A decode step: one query row per head, grouped-query heads, RoPE at position 32, over the
    // first 33 rows of [B, Hkv, 40, E] key/value buffers (a cache: heads 40 rows apart).
    cs.push_back({"attention (decode step over a cache view, GQA, RoPE)",
                  {{{2, 6, 1, 16}, t}, {{2, 2, 40, 16}, t}, {{2, 2, 40, 16}, t}},
                  [](const auto& x) {
                    Tensor k = x[1].narrow(2, 0, 33), v = x[2].narrow(2, 0, 33);
                    auto [out, lse] = attention(x[0], k, v, false, 0.25, {.theta = 500.0, .q_pos = 32, .k_pos = 0});
                    return std::vector<Tensor>{out, lse};
                  }, 4.0});
    cs.push_back({"attention + backward (Tq != Tk, Ev != E)",
                  {{{2, 2, 19, 24}, t}, {{2, 2, 77, 24}, t}, {{2, 2, 77, 40}, t}, {{2, 2, 19, 40}, t}},
                  [](const auto& x) {
                    auto [out, lse] = attention(x[0], x[1], x[2], false, 0.2);
                    auto [dq, dk, dv] = attention_backward(x[3], x[0], x[1], x[2], out, lse, false, 0.2);
                    return std::vector<Tensor>{out, lse, dq, dk, dv};
                  }, 4.0});
  }
  cs.push_back({"attention + backward (head_dim 128, causal)", {{{1, 2, 45, 128}, DType::f32}, {{1, 2, 45, 128}, DType::f32},
                                                                {{1, 2, 45, 128}, DType::f32}, {{1, 2, 45, 128}, DType::f32}},
                [](const auto& x) {
                  auto [out, lse] = attention(x[0], x[1], x[2], true, 0.09);
                  auto [dq, dk, dv] = attention_backward(x[3], x[0], x[1], x[2], out, lse, true, 0.09);
                  return std::vector<Tensor>{out, lse, dq, dk, dv};
                }, 4.0});
  return cs;
}

// ---------------------------------------------------------------- comparison

struct Diff {
  bool ok = true;
  std::string what;
};

// `inputs_tol`: the loosest tolerance of the case's inputs. An f32 output computed from 16-bit
// inputs (attention's lse from bf16 q and k) carries their rounding: where the CPU and CUDA
// kernels round an intermediate differently (the CPU's bf16 attention tiles round rotated q and k,
// P and dS to bf16 before their products, CUDA's loops keep them f32), it differs by that much.
Diff compare(const Tensor& cpu, const Tensor& dev, Device expected, double tol_scale, double inputs_tol) {
  if (cpu.shape() != dev.shape() || cpu.dtype() != dev.dtype())
    return {false, "result " + tensor_desc(dev) + " differs from the CPU's " + tensor_desc(cpu)};
  if (dev.device() != expected) return {false, "result is on " + dev.device().str() + ", not on " + expected.str()};
  std::vector<double> a = to_vector(cpu), b = to_vector(dev);
  // Relative to each value, plus a small part of the largest magnitude: a sum that cancels to
  // near zero carries the rounding of its large terms, not of its small result.
  double max_abs = 1;
  for (double v : a)
    if (std::isfinite(v)) max_abs = std::max(max_abs, std::fabs(v));
  double rtol = std::max(tolerance(cpu.dtype()), inputs_tol) * tol_scale, atol = rtol * 0.1 * max_abs;
  double worst = 0;
  size_t at = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    double d = std::fabs(a[i] - b[i]);
    bool same = a[i] == b[i] || d <= atol + rtol * std::fabs(a[i]);
    if (!same) {
      ++bad;
      if (std::isnan(d) || d > worst || std::isnan(worst)) worst = std::isnan(d) ? d : std::max(worst, d), at = i;
    }
  }
  if (bad == 0) return {};
  char buf[256];
  std::snprintf(buf, sizeof buf, "%lld of %zu elements differ; max diff %.3g at %zu (cpu %.9g, cuda %.9g), rtol %.1g",
                (long long)bad, a.size(), worst, at, a[at], b[at], rtol);
  return {false, buf};
}

// Runs every case (whose label contains `filter`) on the CPU and on `dev`; with dev = CPU
// this checks the table itself, on any machine.
int run_cases(const std::string& filter, Device dev) {
  int passed = 0, failed = 0;
  for (const Case& c : cases()) {
    std::string label = c.name + "  " + shapes_str(c.inputs);
    if (!filter.empty() && label.find(filter) == std::string::npos) continue;
    Generator gen(1234);
    std::vector<Tensor> cpu_in, dev_in;
    std::string error;
    try {
      for (const Input& in : c.inputs) cpu_in.push_back(make_input(in, gen));
      for (const Tensor& t : cpu_in) {
        // Transposed inputs stay transposed views on the device too.
        Tensor d = t.is_contiguous() ? empty(t.shape(), {.dtype = t.dtype(), .device = dev})
                                     : empty(t.transpose(-1, -2).shape(), {.dtype = t.dtype(), .device = dev}).transpose(-1, -2);
        d.copy_(t);
        dev_in.push_back(d);
      }
      double inputs_tol = 0;
      for (const Tensor& t : cpu_in)
        if (is_floating(t.dtype())) inputs_tol = std::max(inputs_tol, tolerance(t.dtype()));
      std::vector<Tensor> want = c.run(cpu_in);
      std::vector<Tensor> got = c.run(dev_in);
      if (want.size() != got.size()) error = "different number of outputs";
      for (size_t k = 0; k < want.size() && error.empty(); ++k) {
        Diff d = compare(want[k], got[k], dev, c.tol_scale, inputs_tol);
        if (!d.ok) error = (want.size() > 1 ? "output " + std::to_string(k) + ": " : "") + d.what;
      }
#if WEFT_WITH_CUDA
      if (dev.is_cuda()) kernels::cuda::synchronize(dev.index);  // a fault in a kernel surfaces at its case
#endif
    } catch (const std::exception& e) {
      error = std::string("threw: ") + e.what();
    }
    if (error.empty()) {
      ++passed;
    } else {
      ++failed;
      std::printf("FAIL %s: %s\n", label.c_str(), error.c_str());
    }
  }
  std::printf("conformance on %s: %d op cases passed, %d failed\n", dev.str().c_str(), passed, failed);
  return failed;
}

#if WEFT_WITH_CUDA

// ---------------------------------------------------------------- runtime checks on a GPU

int g_runtime_failures = 0;
#define EXPECT(cond)                                                                          \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      ++g_runtime_failures;                                                                   \
      std::printf("FAIL runtime: %s (line %d)\n", #cond, __LINE__);                            \
    }                                                                                         \
  } while (0)

void run_runtime_checks() {
  namespace cu = weft::kernels::cuda;
  Device dev = Device::cuda(0);
  std::printf("device: %s (%d visible)\n", cu::device_description(0).c_str(), cu::device_count());

  // Memory stats and caching: freeing keeps the memory reserved; the next same-size
  // allocation reuses it without a new segment; empty_cache gives it back.
  cu::empty_cache(0);
  MemoryStats s0 = memory_stats(dev);
  int64_t segs0 = cu::cache_stats(0).segment_allocs;
  {
    Tensor a = empty({1000, 1000}, {.device = dev});
    MemoryStats s1 = memory_stats(dev);
    EXPECT(s1.live_bytes - s0.live_bytes == 4000000);
    EXPECT(s1.reserved_bytes >= s1.live_bytes);
    EXPECT(s1.peak_bytes >= s1.live_bytes);
  }
  EXPECT(memory_stats(dev).live_bytes == s0.live_bytes);
  EXPECT(memory_stats(dev).reserved_bytes > s0.reserved_bytes);
  int64_t segs1 = cu::cache_stats(0).segment_allocs;
  { Tensor b = empty({1000, 1000}, {.device = dev}); }
  EXPECT(cu::cache_stats(0).segment_allocs == segs1);  // served from the cache
  EXPECT(segs1 > segs0);
  cu::empty_cache(0);
  EXPECT(memory_stats(dev).reserved_bytes == s0.reserved_bytes);

  // Streams (core's, on the CUDA runtime): a StreamGuard redirects the current stream; work on
  // it is correct once waited for.
  Stream side = Stream::create(dev);
  EXPECT(current_stream(dev).handle() == nullptr);  // the default stream
  Tensor x = arange(0, 1 << 20, 1, {.device = dev});
  Event ready;
  ready.record(current_stream(dev));
  Tensor y;
  {
    StreamGuard guard(side);
    EXPECT(current_stream(dev) == side);
    side.wait(ready);
    y = binary_scalar(BinaryOp::mul, x, 2.0);
  }
  EXPECT(current_stream(dev).handle() == nullptr);
  side.synchronize();
  EXPECT(reduce(ReduceOp::max, y, {}, false).item() == double((1 << 21) - 2));

  // Events: timing and completion.
  Event start(true), stop(true);
  start.record(current_stream(dev));
  Tensor z = unary(UnaryOp::exp, y);
  stop.record(current_stream(dev));
  stop.synchronize();
  EXPECT(stop.query());
  EXPECT(start.elapsed_ms(stop) >= 0);

  // Pinned memory: async copies both ways on the current stream, correct after a sync.
  Tensor host = cu::empty_pinned({4096}, DType::f32);
  EXPECT(cu::is_pinned(host.data_ptr()));
  EXPECT(cu::is_pinned(host.narrow(0, 100, 10).data_ptr()));
  EXPECT(!cu::is_pinned(x.to(kCPU).data_ptr()));
  Tensor src = arange(0, 4096, 1);
  host.copy_(src);
  Tensor d = empty({4096}, {.device = dev});
  d.copy_(host);  // async from pinned memory
  Tensor back = cu::empty_pinned({4096}, DType::f32);
  back.copy_(d);  // async into pinned memory
  current_stream(dev).synchronize();
  EXPECT(back.data<float>()[4095] == 4095.f && back.data<float>()[17] == 17.f);
  EXPECT(cu::pinned_memory_stats().live_bytes >= 2 * 4096 * 4);

  // Errors: a device that does not exist, an index out of range on the device.
  bool threw = false;
  try {
    (void)empty({2}, {.device = Device::cuda(cu::device_count())});
  } catch (const Error& e) {
    threw = std::string(e.what()).find("requested") != std::string::npos;
  }
  EXPECT(threw);
  threw = false;
  try {
    (void)embedding(zeros({4, 2}, {.device = dev}), full({3}, 9, {.dtype = DType::i64, .device = dev}));
  } catch (const Error& e) {
    threw = std::string(e.what()).find("out of range") != std::string::npos;
  }
  EXPECT(threw);
  // The other index ops check their ranges on the host too (indexing_backward.cu).
  Tensor bad_index = full({2, 3}, 5, {.dtype = DType::i64, .device = dev});
  auto throws_range = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what()).find("out of range") != std::string::npos;
    }
    return false;
  };
  EXPECT(throws_range([&] { (void)embedding_backward(ones({2, 3, 4}, {.device = dev}), bad_index, 5); }));
  EXPECT(throws_range([&] { (void)index_select(ones({4, 2}, {.device = dev}), 0, bad_index.view({6})); }));
  EXPECT(throws_range([&] { (void)index_add({4, 2}, 0, bad_index.view({6}), ones({6, 2}, {.device = dev})); }));
  EXPECT(throws_range([&] { (void)gather(ones({4, 3}, {.device = dev}), 0, bad_index); }));
  EXPECT(throws_range([&] { (void)scatter_add(ones({4, 3}, {.device = dev}), 0, bad_index, ones({2, 3}, {.device = dev})); }));

  // The op profiler on a GPU: a row is the op's device time (each entry waits for the device),
  // not the microseconds of queueing its kernel.
  Tensor ma = ones({4096, 4096}, {.device = dev}), mb = ones({4096, 4096}, {.device = dev});
  (void)matmul(ma, mb);
  synchronize(dev);
  const auto t0 = std::chrono::steady_clock::now();
  (void)matmul(ma, mb);
  synchronize(dev);
  const double alone = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  op_profiler::start();
  (void)matmul(ma, mb);
  op_profiler::stop();
  double timed = 0;
  for (const op_profiler::Row& r : op_profiler::rows())
    if (r.name.starts_with("matmul 4096x4096x4096")) timed = r.seconds;
  std::printf("op profiler: a 4096^3 f32 matmul %.3f ms alone, its row %.3f ms\n", 1e3 * alone, 1e3 * timed);
  EXPECT(timed > 0.5 * alone);
  std::printf("runtime checks: %d failed\n", g_runtime_failures);
}

#endif  // WEFT_WITH_CUDA

}  // namespace

// test_cuda_conformance [--cpu] [filter]: --cpu runs the table CPU against CPU (checks the
// cases themselves; needs no GPU); filter keeps the cases whose label contains it.
int main(int argc, char** argv) {
  bool cpu_only = argc > 1 && std::string(argv[1]) == "--cpu";
  std::string filter = argc > 1 + int(cpu_only) ? argv[1 + int(cpu_only)] : "";
  if (cpu_only) return run_cases(filter, kCPU) == 0 ? 0 : 1;
#if !WEFT_WITH_CUDA
  std::printf("SKIP: weft was built without CUDA (-Dcuda=disabled, or no CUDA toolkit found); %zu op cases not run\n",
              cases().size());
  return 77;
#else
  if (!kernels::cuda::is_available()) {
    std::printf("SKIP: no CUDA device visible (%s); %zu op cases not run\n", kernels::cuda::unavailable_reason().c_str(),
                cases().size());
    return 77;
  }
  int failed = run_cases(filter, Device::cuda(0));
  if (filter.empty()) run_runtime_checks();
  return failed + g_runtime_failures == 0 ? 0 : 1;
#endif
}
