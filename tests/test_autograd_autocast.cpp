// autocast (autograd/autocast.h): products compute from bf16 operands and return bf16, their
// gradients reach f32 inputs and master weights in f32 (computed from the bf16 operands), the
// loss and norms stay f32, and a checkpointed recompute runs under its forward's policy. Each
// check compares against a double loop over the bf16-rounded values, and confirms the f32
// answer is measurably different, so a policy that silently computes in f32 fails.
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "core/allocator.h"
#include "core/op_profiler.h"
#include "core/generator.h"
#include "kernels/elementwise.h"
#include "nn/activation_checkpoint.h"
#include "test_util.h"

using namespace weft;

namespace {

double bf16_round(double v) { return double(float(BFloat16(float(v)))); }

// c[i, j] = sum_p a[i, p] b[j, p] in double (a [m, k], b [n, k], row-major values).
std::vector<double> products_abt(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t n,
                                 int64_t k, bool round_inputs) {
  std::vector<double> c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) {
        double x = a[size_t(i * k + p)], y = b[size_t(j * k + p)];
        s += round_inputs ? bf16_round(x) * bf16_round(y) : x * y;
      }
      c[size_t(i * n + j)] = s;
    }
  return c;
}

std::vector<double> transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = a[size_t(i * cols + j)];
  return t;
}

double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-3));
  return m;
}

}  // namespace

TEST_CASE("autocast: linear computes from bf16 operands; its gradients reach f32 weights in f32") {
  const int64_t m = 24, k = 96, n = 40;
  Generator gen(7);
  Tensor x = randn({m, k}, {}, &gen), w = randn({n, k}, {}, &gen), b = randn({n}, {}, &gen),
         r = randn({m, n}, {}, &gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y;
  {
    AutocastGuard autocast;
    y = linear(x, w, b);
    CHECK(y.dtype() == DType::bf16);
    sum(y * r).backward();  // y * r promotes to f32: the gradient of y is r rounded to bf16
  }
  CHECK(x.grad().dtype() == kFloat32);
  CHECK(w.grad().dtype() == kFloat32);
  CHECK(b.grad().dtype() == kFloat32);
  const auto xv = to_vector(x), wv = to_vector(w), bv = to_vector(b), rv = to_vector(r);

  // Forward: the bf16-input products plus the bias, rounded once to bf16.
  std::vector<double> want = products_abt(xv, wv, m, n, k, true), f32_answer = products_abt(xv, wv, m, n, k, false);
  for (size_t i = 0; i < want.size(); ++i) {
    want[i] = bf16_round(want[i] + bf16_round(bv[i % size_t(n)]));
    f32_answer[i] = bf16_round(f32_answer[i] + bv[i % size_t(n)]);
  }
  test::check_values(y, want, 1.0 / 256, 1e-2);

  // Weight gradient: r(bf16)^T x(bf16), f32 sums stored unrounded (within f32 summation error).
  std::vector<double> rb(rv.size());
  for (size_t i = 0; i < rv.size(); ++i) rb[i] = bf16_round(rv[i]);
  const auto rt = transpose(rb, m, n), xt = transpose(xv, m, k);
  std::vector<double> gw = products_abt(rt, xt, n, k, m, true), gw_f32 = products_abt(transpose(rv, m, n), xt, n, k, m, false);
  test::check_values(w.grad(), gw, 1e-5, 1e-5);
  INFO("f32-input weight gradient vs the bf16 one: " << max_rel_diff(gw_f32, gw));
  CHECK(max_rel_diff(gw_f32, gw) > 1e-3);  // an f32 computation could not pass the check above

  // Input gradient: r(bf16) w(bf16), f32; bias gradient: column sums of r(bf16).
  std::vector<double> gx = products_abt(rb, transpose(wv, n, k), m, k, n, true);
  test::check_values(x.grad(), gx, 1e-5, 1e-5);
  std::vector<double> gb(size_t(n), 0.0);
  for (size_t i = 0; i < rb.size(); ++i) gb[i % size_t(n)] += rb[i];
  test::check_values(b.grad(), gb, 1.0 / 128, 1e-2);  // summed, then rounded to bf16 once
}

TEST_CASE("autocast: matmul and attention return bf16; cross_entropy and layer_norm stay f32") {
  Generator gen(3);
  Tensor a = randn({2, 8, 16}, {}, &gen), c = randn({16, 12}, {}, &gen);
  a.set_requires_grad(true);
  c.set_requires_grad(true);
  AutocastGuard autocast;
  Tensor p = matmul(a, c);
  CHECK(p.dtype() == DType::bf16);
  std::vector<double> want(size_t(16 * 12)), av = to_vector(a), cv = to_vector(c), got = to_vector(p);
  int bad = 0;
  for (int64_t i = 0; i < 16; ++i)
    for (int64_t j = 0; j < 12; ++j) {
      double s = 0;
      for (int64_t q = 0; q < 16; ++q) s += bf16_round(av[size_t(i * 16 + q)]) * bf16_round(cv[size_t(q * 12 + j)]);
      bad += std::fabs(got[size_t(i * 12 + j)] - bf16_round(s)) > std::fabs(s) / 128 + 1e-2;
    }
  CHECK(bad == 0);
  sum(p).backward();
  CHECK(a.grad().dtype() == kFloat32);
  CHECK(c.grad().dtype() == kFloat32);

  Tensor q = randn({1, 2, 8, 16}, {}, &gen);
  CHECK(scaled_dot_product_attention(q, q, q, true).dtype() == DType::bf16);
  CHECK(scaled_dot_product_attention_qkv(randn({1, 8, 48}, {}, &gen), 2).dtype() == DType::bf16);

  Tensor logits = randn({6, 10}, {.dtype = DType::bf16}, &gen);
  Tensor target = from_vector({0, 3, 9, 1, 2, 5}, {6}, {.dtype = DType::i64});
  Tensor loss = cross_entropy(logits, target);
  CHECK(loss.dtype() == kFloat32);
  Tensor loss_f32;
  {
    AutocastGuard off(DType::bf16, false);
    CHECK(!autocast_dtype().has_value());
    loss_f32 = cross_entropy(logits.to(kFloat32), target);
  }
  CHECK(autocast_dtype() == DType::bf16);
  CHECK(std::fabs(loss.item() - loss_f32.item()) <= 1e-6 * std::fabs(loss_f32.item()));  // computed from the same bf16 values
  CHECK(layer_norm(randn({4, 16}, {}, &gen), {16}).dtype() == kFloat32);
}

// Under autocast a norm can meet a bf16 activation and its f32 weight (Qwen3's q and k norms after the bf16
// projections): it computes in f32, as an element-wise op promotes, with each gradient in its input's dtype (it had
// refused the dtypes, so a one-process bf16 Qwen3 could not train).
TEST_CASE("autocast: a norm of a bf16 activation with f32 weights computes in f32, as the widened input would") {
  Generator gen(5);
  const Tensor x16 = randn({3, 4, 8}, {}, &gen).to(DType::bf16), w = randn({8}, {}, &gen), b = randn({8}, {}, &gen),
               g = randn({3, 4, 8}, {}, &gen);
  for (bool rms : {true, false}) {
    INFO((rms ? "rms_norm" : "layer_norm"));
    auto norm = [&](const Tensor& x, const Tensor& weight, const Tensor& bias) {
      return rms ? rms_norm(x, {8}, weight, 1e-6) : layer_norm(x, {8}, weight, bias, 1e-5);
    };
    Tensor x = x16.detach(), xw = x16.to(kFloat32).detach(), w1 = w.detach(), w2 = w.detach(), b1 = b.detach(), b2 = b.detach();
    for (Tensor* t : {&x, &xw, &w1, &w2, &b1, &b2}) t->set_requires_grad(true);
    AutocastGuard autocast;
    const Tensor y = norm(x, w1, b1), want = norm(xw, w2, b2);
    CHECK(y.dtype() == kFloat32);
    test::check_values(y, to_vector(want), 0, 0);
    sum(y * g).backward();
    sum(want * g).backward();
    CHECK((x.grad().dtype() == DType::bf16 && w1.grad().dtype() == kFloat32));
    test::check_values(x.grad(), to_vector(xw.grad().to(DType::bf16)), 0, 0);
    test::check_values(w1.grad(), to_vector(w2.grad()), 0, 0);
    if (!rms) test::check_values(b1.grad(), to_vector(b2.grad()), 0, 0);
  }
}

// The loss of a 50,257-token head at ctx 1024 has logits of 100 MB a sequence: its backward
// keeps those (bf16 under autocast) and two f32 numbers a row, not an f32 copy of log-probs.
TEST_CASE("autocast: cross_entropy keeps the bf16 logits and two numbers a row for its backward") {
  Generator gen(5);
  const int64_t n = 64, c = 1000;
  Tensor logits = randn({n, c}, {}, &gen).to(DType::bf16);
  logits.set_requires_grad(true);
  Tensor target = arange(0, double(n) * 7, 7, {.dtype = DType::i64});
  AutocastGuard autocast;
  const int64_t before = memory_stats().live_bytes;
  Tensor loss = cross_entropy(logits, target);
  const int64_t held = memory_stats().live_bytes - before;
  INFO("bytes held after the forward: " << held);
  CHECK(held < n * c);  // under half the bf16 logits; f32 log-probs would be 4 n c
  loss.backward();
  REQUIRE(logits.grad().dtype() == DType::bf16);
  Tensor wide = logits.detach().to(kFloat32);
  wide.set_requires_grad(true);
  {
    AutocastGuard off(DType::bf16, false);
    cross_entropy(wide, target).backward();
  }
  std::vector<double> got = to_vector(logits.grad()), want = to_vector(wide.grad());
  int bad = 0;
  // The f32 gradient of the same values rounded once to bf16, but for the last bit of a row's
  // log-sum (its sum may add in another order), which can move a value by one bf16 step.
  for (size_t i = 0; i < got.size(); ++i) bad += std::fabs(got[i] - bf16_round(want[i])) > std::fabs(want[i]) / 128;
  CHECK(bad == 0);
}

// Llama's q, k and v projections read one normalised x: under autocast they share one bf16 copy of
// it (kept for their backward) instead of casting and keeping three; a write into x between two of
// them is seen (the copy is made again).
TEST_CASE("autocast: projections of one input share its 16-bit copy, made again after a write") {
  Generator gen(9);
  const int64_t n = 64, d = 256;
  Tensor x = randn({n, d}, {}, &gen);
  x.set_requires_grad(true);
  std::vector<Tensor> w;
  for (int i = 0; i < 3; ++i) w.push_back(randn({d, d}, {}, &gen)), w.back().set_requires_grad(true);
  AutocastGuard autocast;
  const int64_t before = memory_stats().live_bytes;
  std::vector<Tensor> out;
  for (const Tensor& wi : w) out.push_back(linear(x, wi));
  const int64_t held = memory_stats().live_bytes - before, copy = n * d * 2;
  INFO("bytes held: " << held << ", one bf16 copy of x: " << copy);
  CHECK(held < 3 * n * d * 2 + 3 * d * d * 2 + 2 * copy);  // outputs, weight casts, and x once
  CHECK(held >= 3 * n * d * 2 + 3 * d * d * 2 + copy);
  sum(out[0] + out[1] + out[2]).backward();
  REQUIRE(x.grad().defined());

  Tensor y = randn({n, d}, {}, &gen);
  const Tensor first = linear(y, w[0]);  // its backward keeps the bf16 copy of y alive
  y.copy_(y.detach() + y.detach());  // doubles every value: exact in bf16, and a version of y's storage
  const std::vector<double> once = to_vector(first), twice = to_vector(linear(y, w[0]));
  int bad = 0;
  for (size_t i = 0; i < once.size(); ++i) bad += twice[i] != 2 * once[i];
  CHECK(bad == 0);
}

TEST_CASE("autocast: a checkpointed recompute runs under its forward's policy") {
  Generator gen(11);
  Tensor x = randn({8, 32}, {}, &gen), w1 = randn({32, 32}, {}, &gen), w2 = randn({32, 32}, {}, &gen);
  auto grads = [&](bool checkpointed) {
    for (Tensor* t : {&w1, &w2}) {
      t->set_requires_grad(true);
      t->set_grad(Tensor());
    }
    auto fn = [&](const autograd::TensorList& in) { return autograd::TensorList{linear(gelu(linear(in[0], w1)), w2)}; };
    Tensor y;
    {
      AutocastGuard autocast;
      y = checkpointed ? nn::checkpoint(fn, {x})[0] : fn({x})[0];
    }
    sum(y * y).backward();  // outside the guard: the recompute must restore it
    return std::pair{to_vector(w1.grad()), to_vector(w2.grad())};
  };
  auto plain = grads(false), ckpt = grads(true);
  CHECK(plain.first == ckpt.first);
  CHECK(plain.second == ckpt.second);
}

TEST_CASE("autocast: low_rank_linear casts x once and writes y in one product, the composition's values") {
  Generator gen(9);
  Tensor x = randn({2, 8, 16}, {}, &gen), w = randn({24, 16}, {}, &gen), bias = randn({24}, {}, &gen);
  Tensor a = randn({4, 16}, {}, &gen), b = randn({24, 4}, {}, &gen), r = randn({2, 8, 24}, {}, &gen);
  for (Tensor* t : {&x, &a, &b}) t->set_requires_grad(true);
  op_profiler::start();
  Tensor y;
  {
    AutocastGuard autocast;
    y = low_rank_linear(x, x, w, bias, a, b, 2.0);
  }
  sum(y * r).backward();
  op_profiler::stop();
  int64_t casts = 0, joined = 0;  // casts into whole tensors or into the joined operands ("... strided")
  for (const auto& row : op_profiler::rows()) {
    if (row.name.starts_with("cast f32 -> bf16")) casts += row.calls;
    if (row.name.starts_with("gemm 16x24x32 NT")) joined += row.calls;  // [x | h | 0] [W | B | 0]^T: depth 16 + 4, to 32
  }
  CHECK(casts == 6);  // x, W, the bias, A and B, each once, and y's f32 gradient (r) to y's bf16
  CHECK(joined == 1);  // y written by one product
  REQUIRE(y.dtype() == DType::bf16);
  REQUIRE(x.grad().dtype() == kFloat32);
  // The composition from the same bf16-rounded operands in f64, rounded once (one product of
  // depth in + r): within a bf16 step.
  auto round16 = [](const Tensor& t) { return t.detach().to(DType::bf16).to(kFloat64); };
  Tensor x64 = round16(x), w64 = round16(w), a64 = round16(a), b64 = round16(b);
  Tensor h = (linear(x64, a64) * 2.0).to(DType::bf16).to(kFloat64);  // the rank-r activation, rounded
  Tensor want = linear(x64, w64, round16(bias)) + linear(h, b64);
  test::check_values(y, to_vector(want), 1.0 / 256, 1e-6);
  // x's gradient: r W + (2 r B rounded) A, from the rounded operands, summed in f32.
  Tensor r64 = round16(r), dh = (matmul(r64, b64) * 2.0).to(DType::bf16).to(kFloat64);
  Tensor dx = matmul(r64, w64) + matmul(dh, a64);
  test::check_values(x.grad(), to_vector(dx), 1e-5, 1e-5);
  test::check_values(b.grad(), to_vector(matmul(r64.reshape({16, 24}).t(), h.reshape({16, 4}))), 1e-5, 1e-5);
}

TEST_CASE("autocast: only 16-bit dtypes") {
  CHECK_THROWS_WITH(AutocastGuard(kFloat32), Catch::Contains("bf16 or f16, not f32"));
  CHECK(!autocast_dtype().has_value());
}

TEST_CASE("autocast and f32: a tied head's weight gradient arrives in the weight's layout, with no strided copy") {
  for (bool autocast : {false, true}) {
    Generator gen(5);
    Tensor w = randn({40, 16}, {}, &gen), x = randn({2, 8, 16}, {}, &gen), r = randn({2, 8, 40}, {}, &gen);
    w.set_requires_grad(true);
    op_profiler::start();
    {
      AutocastGuard policy(DType::bf16, autocast);
      sum(matmul(x, w.transpose(0, 1)) * r).backward();
    }
    op_profiler::stop();
    for (const auto& row : op_profiler::rows()) {
      INFO("autocast " << autocast << ": " << row.name);
      CHECK(row.name.find("strided") == std::string::npos);
    }
    // dL/dW[v, c] = sum over rows of r[row, v] x[row, c] (from bf16-rounded operands under autocast).
    std::vector<double> xv = to_vector(x), rv = to_vector(r), want(40 * 16, 0.0);
    for (int64_t row = 0; row < 16; ++row)
      for (int64_t v = 0; v < 40; ++v)
        for (int64_t c = 0; c < 16; ++c) {
          const double xr = xv[size_t(row * 16 + c)], rr = rv[size_t(row * 40 + v)];
          want[size_t(v * 16 + c)] += autocast ? bf16_round(rr) * bf16_round(xr) : rr * xr;
        }
    REQUIRE(w.grad().dtype() == kFloat32);
    test::check_values(w.grad(), want, autocast ? 8e-3 : 1e-5, autocast ? 1e-3 : 1e-5);
  }
}

TEST_CASE("autocast: cross_entropy reads bf16 logits with no widened copy; the loss is f32, bf16 without autocast") {
  Generator gen(8);
  Tensor logits = randn({16, 300}, {.dtype = DType::bf16}, &gen), wide = logits.to(kFloat32);
  logits.set_requires_grad(true);
  wide.set_requires_grad(true);
  Tensor target = from_vector({0, 3, 9, 1, 2, 5, 299, 100, 0, 3, 9, 1, 2, 5, 7, 8}, {16}, {.dtype = DType::i64});
  Tensor loss;
  op_profiler::start();
  {
    AutocastGuard autocast;
    loss = cross_entropy(logits, target);
  }
  loss.backward();
  op_profiler::stop();
  for (const auto& row : op_profiler::rows()) {
    INFO(row.name);
    CHECK(row.name.rfind("cast", 0) == std::string::npos);
  }
  CHECK(loss.dtype() == kFloat32);
  Tensor loss32 = cross_entropy(wide, target);
  CHECK(std::fabs(loss.item() - loss32.item()) <= 1e-6 * std::fabs(loss32.item()));
  loss32.backward();
  REQUIRE(logits.grad().dtype() == DType::bf16);
  test::check_values(logits.grad(), to_vector(wide.grad().to(DType::bf16)), 1.0 / 128, 1e-7);
  CHECK(cross_entropy(logits, target).dtype() == DType::bf16);  // as torch outside autocast
}

TEST_CASE("autocast: SwiGLU's backward on bf16 is one pass, with the bits of its three-op composite") {
  Generator gen(6);
  Tensor gate = randn({8, 40}, {}, &gen), up = randn({8, 40}, {}, &gen), r = randn({8, 40}, {}, &gen);
  Tensor x = randn({8, 16}, {}, &gen), wg = randn({40, 16}, {}, &gen), wu = randn({40, 16}, {}, &gen);
  wg.set_requires_grad(true), wu.set_requires_grad(true);
  op_profiler::start();
  Tensor g, u;
  {
    AutocastGuard autocast;
    g = matmul(x, wg.transpose(0, 1)), u = matmul(x, wu.transpose(0, 1));  // bf16, as a Llama MLP's gate and up
    g.retain_grad(), u.retain_grad();
    sum(swiglu(g, u) * r).backward();
  }
  op_profiler::stop();
  int64_t fused = 0, composite = 0;
  for (const auto& row : op_profiler::rows()) {
    if (row.name.starts_with("swiglu_backward bf16")) fused += row.calls;
    if (row.name.starts_with("silu_grad_mul") || row.name.starts_with("mul bf16")) composite += row.calls;
  }
  CHECK(fused == 1);
  CHECK(composite == 0);
  REQUIRE(g.dtype() == DType::bf16);
  const Tensor dy = r.to(DType::bf16);  // the gradient swiglu's output receives
  const Tensor gd = g.detach(), ud = u.detach();
  test::check_same_bits(kernels::binary(kernels::BinaryOp::silu_grad_mul, gd, kernels::binary(kernels::BinaryOp::mul, dy, ud)), g.grad(),
                        "d gate");
  test::check_same_bits(kernels::binary(kernels::BinaryOp::silu_mul, gd, dy), u.grad(), "d up");
}

// f64 is left as it is under autocast (as torch's CPU autocast), and an f16 input read in bf16 gets its gradient in
// f16 (linear's backward had asked the product for an f16 or f64 output of bf16 operands, which it refuses).
TEST_CASE("autocast: linear on f64 stays f64; on f16 its backward gives f16 gradients") {
  for (DType dt : {kFloat64, kFloat16}) {
    INFO(dtype_name(dt));
    Tensor x = randn({2, 3}).to(dt), w = randn({4, 3}).to(dt);
    x.set_requires_grad(true), w.set_requires_grad(true);
    Tensor y;
    {
      AutocastGuard autocast;
      y = linear(x, w);
    }
    CHECK(y.dtype() == (dt == kFloat64 ? kFloat64 : kBFloat16));
    sum(y).backward();
    CHECK(x.grad().dtype() == dt);
    CHECK(w.grad().dtype() == dt);
    CHECK(to_vector(x.grad())[0] == Approx(to_vector(sum(w.to(kFloat64), {0}))[0]).epsilon(2e-2));
  }
}
