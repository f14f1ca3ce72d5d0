// Fused scaled-dot-product attention (kernels/attention.h, weft::scaled_dot_product_attention
// and its fused-qkv form) against the composite reference matmul -> masked_fill -> softmax ->
// matmul: outputs and gradients at several shapes (sequence lengths that are not multiples
// of the kernel's row block, T = 1, Tq != Tk), strided inputs, f64 gradcheck, 16-bit
// inputs, the dropout fallback, nn::CausalSelfAttention, and the errors bad arguments raise;
// grouped-query heads and rotary embeddings against a reference that repeats the key/value
// heads and rotates q and k with tables computed here, at every f32 kernel the CPU runs.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <cmath>
#include <limits>
#include <sstream>

#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "test_util.h"
#include "weft.h"

using namespace weft;
using autograd::gradcheck;
using autograd::TensorList;
using Catch::Matchers::Contains;

namespace {

Generator gen(11);

Tensor random(const Shape& shape, DType dt = kFloat32, double scale = 1.0) {
  Tensor t = empty(shape, {.dtype = dt});
  t.normal_(0.0, scale, &gen);
  return t;
}

// The composite reference: the naive attention every GPT implementation starts from.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  Tensor att = matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(q.size(-1))));
  if (causal) {
    int64_t tq = q.size(-2), tk = k.size(-2);
    Tensor rows = arange(0, double(tq), 1, {.dtype = kInt64}).view({tq, 1});
    Tensor cols = arange(0, double(tk), 1, {.dtype = kInt64}).view({1, tk});
    att = masked_fill(att, cols > rows, -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(att, -1), v);
}

// Largest |a - b| / (atol + rtol |b|) over all elements, with the worst element described.
struct Diff {
  double worst = 0;
  std::string where;
};
Diff compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  REQUIRE(got.shape() == want.shape());
  std::vector<double> g = to_vector(got.contiguous()), w = to_vector(want.contiguous());
  Diff d;
  for (size_t i = 0; i < g.size(); ++i) {
    double r = g[i] == w[i] ? 0.0 : std::fabs(g[i] - w[i]) / (atol + rtol * std::fabs(w[i]));
    if (!(r <= d.worst)) {  // NaN counts as worst
      d.worst = std::isnan(r) ? INFINITY : r;
      std::ostringstream s;
      s << "[" << i << "] got " << g[i] << ", want " << w[i];
      d.where = s.str();
    }
  }
  return d;
}
void check_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  Diff d = compare(got, want, rtol, atol);
  INFO(what << " " << tensor_desc(got) << ": worst " << d.where << " (" << d.worst << " x tolerance)");
  CHECK(d.worst <= 1.0);
}

// The fused op's output and gradients (y, dq, dk, dv) against the reference's.
void check_fused_against(const TensorList& got, const TensorList& want, const std::string& name) {
  check_close(got[0], want[0], 1e-4, 1e-5, name + " output");
  check_close(got[1], want[1], 1e-3, 1e-5, name + " dq");
  check_close(got[2], want[2], 1e-3, 1e-5, name + " dk");
  check_close(got[3], want[3], 1e-3, 1e-5, name + " dv");
}

// Forward and all three gradients of the fused op against the reference, for the same
// upstream gradient.
void check_against_reference(int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t E, int64_t Ev, bool causal) {
  std::ostringstream name;
  name << "B" << B << " H" << H << " Tq" << Tq << " Tk" << Tk << " E" << E << " Ev" << Ev
       << (causal ? " causal" : " full");
  Tensor q = random({B, H, Tq, E}), k = random({B, H, Tk, E}), v = random({B, H, Tk, Ev});
  Tensor gout = random({B, H, Tq, Ev});
  auto run = [&](bool fused) {
    Tensor qq = q.clone().set_requires_grad(), kk = k.clone().set_requires_grad(), vv = v.clone().set_requires_grad();
    Tensor y = fused ? scaled_dot_product_attention(qq, kk, vv, causal) : reference(qq, kk, vv, causal);
    sum(y * gout).backward();
    return TensorList{y.detach(), qq.grad(), kk.grad(), vv.grad()};
  };
  check_fused_against(run(true), run(false), name.str());
}

// Rotary embedding of x [B, H, T, E] at positions pos0.. in the rotate-half convention, with
// angles computed here in f64 (independent of kernels/rope.cpp's tables).
Tensor rope_reference(const Tensor& x, double theta, int64_t pos0) {
  const int64_t T = x.size(2), E = x.size(3), half = E / 2;
  Tensor c = empty({T, half}, {.dtype = kFloat64}), s = empty({T, half}, {.dtype = kFloat64});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(pos0 + t) * std::pow(theta, -2.0 * double(i) / double(E));
      c.data<double>()[t * half + i] = std::cos(angle);
      s.data<double>()[t * half + i] = std::sin(angle);
    }
  c = c.to(x.dtype()), s = s.to(x.dtype());
  Tensor x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

// Key/value head h / G for every query head h: [B, Hkv, T, C] -> [B, Hkv * G, T, C].
Tensor repeat_heads(const Tensor& x, int64_t G) {
  const int64_t B = x.size(0), Hkv = x.size(1), T = x.size(2), C = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, G, T, C}).reshape({B, Hkv * G, T, C});
}

// The fused op with Hkv key/value heads and rotary embeddings against the reference, forward
// and the three gradients (dk, dv summed over each group's query heads).
void check_gqa_rope(int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t E, bool causal, double theta,
                    int64_t q_pos = 0, int64_t k_pos = 0) {
  std::ostringstream name;
  name << "B" << B << " H" << H << " Hkv" << Hkv << " T" << T << " E" << E << (causal ? " causal" : " full")
       << " theta " << theta << " positions " << q_pos << "/" << k_pos;
  Tensor q = random({B, H, T, E}), k = random({B, Hkv, T, E}), v = random({B, Hkv, T, E});
  Tensor gout = random({B, H, T, E});
  auto run = [&](bool fused) {
    Tensor qq = q.clone().set_requires_grad(), kk = k.clone().set_requires_grad(), vv = v.clone().set_requires_grad();
    Tensor y;
    if (fused) {
      y = scaled_dot_product_attention(
          qq, kk, vv, AttentionOptions{.causal = causal, .rope = {.theta = theta, .q_pos = q_pos, .k_pos = k_pos}});
    } else {
      Tensor qr = theta > 0 ? rope_reference(qq, theta, q_pos) : qq;
      Tensor kr = theta > 0 ? rope_reference(kk, theta, k_pos) : kk;
      y = reference(qr, repeat_heads(kr, H / Hkv), repeat_heads(vv, H / Hkv), causal);
    }
    sum(y * gout).backward();
    return TensorList{y.detach(), qq.grad(), kk.grad(), vv.grad()};
  };
  check_fused_against(run(true), run(false), name.str());
}

}  // namespace

TEST_CASE("attention: grouped-query heads and rotary embeddings match the reference at every kernel") {
  using namespace weft::kernels::cpu;
  const SgemmKernel saved = sgemm_kernel();
  for (SgemmKernel kernel : {SgemmKernel::avx512, SgemmKernel::avx512_8x48, SgemmKernel::avx2, SgemmKernel::eigen}) {
    if (!sgemm_kernel_supported(kernel)) {
      std::printf("skipping grouped-query attention with the %s kernel: this CPU does not have that instruction "
                  "set\n", sgemm_kernel_name(kernel));
      continue;
    }
    set_sgemm_kernel(kernel);
    INFO("kernel " << sgemm_kernel_name(kernel));
    for (int64_t E : {8, 16, 64}) {  // 16 and 64 take the register-tiled loops under AVX-512
      check_gqa_rope(2, 6, 2, 37, E, true, 10000.0);        // groups of 3, rope
      check_gqa_rope(1, 4, 1, 33, E, true, 500000.0);       // one key/value head for all
      check_gqa_rope(2, 4, 4, 20, E, true, 10000.0);        // rope without grouping
      check_gqa_rope(2, 4, 2, 19, E, false, 0.0);           // grouping without rope, non-causal
      check_gqa_rope(1, 2, 1, 9, E, false, 10000.0, 5, 3);  // positions not starting at 0
    }
  }
  set_sgemm_kernel(saved);
}

TEST_CASE("attention: one query row (a decode step) over cached keys read in place matches the reference") {
  // q [B, H, 1, E] at position Tk - 1 against the first Tk rows of [B, Hkv, 40, E] buffers (a
  // key/value cache: head strides of 40 rows), rotated from position 0; forward against the
  // reference, then the gradients (the general backward on the decode step's output and lse).
  for (DType dt : {kFloat32, kFloat64}) {
    for (auto [H, Hkv, Tk, E, theta] : {std::tuple{6, 2, 33, 64, 10000.0}, {4, 4, 1, 16, 500.0}, {3, 1, 40, 8, 0.0},
                                        {4, 2, 17, 12, 0.0}}) {
      INFO("dtype " << dtype_name(dt) << " H" << H << " Hkv" << Hkv << " Tk" << Tk << " E" << E << " theta " << theta);
      const int64_t B = 2, G = H / Hkv;
      Tensor q = random({B, H, 1, E}, dt), kbuf = random({B, Hkv, 40, E}, dt), vbuf = random({B, Hkv, 40, E}, dt);
      Tensor k = kbuf.narrow(2, 0, Tk), v = vbuf.narrow(2, 0, Tk), gout = random({B, H, 1, E}, dt);
      const AttentionOptions opts{.causal = false, .rope = {.theta = theta, .q_pos = Tk - 1, .k_pos = 0}};
      auto ref = [&, theta = theta, Tk = Tk](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
        Tensor qr = theta > 0 ? rope_reference(qq, theta, Tk - 1) : qq, kr = theta > 0 ? rope_reference(kk, theta, 0) : kk;
        return reference(qr, repeat_heads(kr, G), repeat_heads(vv, G), false);
      };
      const double rtol = dt == kFloat64 ? 1e-12 : 1e-4;
      {
        NoGradGuard no_grad;
        check_close(scaled_dot_product_attention(q, k, v, opts), ref(q, k, v), rtol, rtol / 10, "decode step");
      }
      auto run = [&](bool fused) {
        Tensor qq = q.clone().set_requires_grad(), kk = k.clone().set_requires_grad(), vv = v.clone().set_requires_grad();
        Tensor y = fused ? scaled_dot_product_attention(qq, kk, vv, opts) : ref(qq, kk, vv);
        sum(y * gout).backward();
        return TensorList{y.detach(), qq.grad(), kk.grad(), vv.grad()};
      };
      const TensorList got = run(true), want = run(false);
      for (size_t i = 0; i < 4; ++i) check_close(got[i], want[i], rtol * 10, rtol, "decode step output/gradient " + std::to_string(i));
    }
  }
}

// A thread's scratch holds a block of scores against every key: past the machine's memory it is an out-of-memory
// error, before the threads start (inside an OpenMP region the exception would end the process). The backward takes
// its scratch the same way, but its key gradient would be as large as the keys (an allocation a sanitizer stops).
TEST_CASE("attention: scratch the memory cannot hold is an error, in the blocked loops and the decode step") {
  for (int64_t tq : {2, 1}) {  // the blocked loops, the decode step
    INFO("query rows " << tq);
    Tensor q = randn({1, 1, tq, 8}).set_requires_grad();
    Tensor kv = randn({1, 1, 1, 8}).expand({1, 1, int64_t(1) << 40, 8});
    CHECK_THROWS_AS(scaled_dot_product_attention(q, kv, kv, false), OutOfMemoryError);
    CHECK_THROWS_WITH(scaled_dot_product_attention(q, kv, kv, false), Catch::Contains("attention: no memory for"));
  }
}

TEST_CASE("attention: grouped-query heads and rotary embeddings pass gradcheck in f64") {
  auto leaf = [](const Shape& s) { return random(s, kFloat64).set_requires_grad(); };
  for (bool causal : {true, false}) {
    auto r = gradcheck(
        [causal](const TensorList& x) {
          return scaled_dot_product_attention(
              x[0], x[1], x[2], AttentionOptions{.causal = causal, .rope = {.theta = 100.0, .q_pos = 2, .k_pos = 2}});
        },
        {leaf({2, 4, 6, 4}), leaf({2, 2, 6, 4}), leaf({2, 2, 6, 4})});
    INFO(r.message);
    CHECK(r.ok);
  }
  auto rr = gradcheck([](const TensorList& x) { return rotary_embedding(x[0], 10.0, 3); }, {leaf({2, 5, 6})});
  INFO(rr.message);
  CHECK(rr.ok);
}

TEST_CASE("attention: rotary_embedding and the dropout path rotate as the fused kernel does") {
  Tensor x = random({2, 3, 11, 8});
  check_close(rotary_embedding(x, 10000.0, 4), rope_reference(x, 10000.0, 4), 1e-5, 1e-6, "rotary_embedding");
  // With dropout 0 < p the composite ops run; with the same generator state twice, a p of
  // ~0 keeps every probability, so they must equal the fused result.
  Tensor q = random({1, 4, 9, 8}), k = random({1, 2, 9, 8}), v = random({1, 2, 9, 8});
  AttentionOptions fused{.causal = true, .rope = {.theta = 10000.0}};
  AttentionOptions composite = fused;
  composite.dropout_p = 1e-12;
  const Tensor unscaled = scaled_dot_product_attention(q, k, v, fused);
  check_close(scaled_dot_product_attention(q, k, v, composite), unscaled, 1e-4, 1e-5, "dropout path with GQA and rope");
  // A rope scaling reaches both paths and changes the rotation (kernels/rope.h: every wavelength
  // here is past 4 / low_freq_factor, so every frequency is divided by the factor).
  fused.rope.scaling = composite.rope.scaling = {.kind = kernels::RopeScaling::Kind::llama3, .factor = 8,
                                                 .original_context = 4};
  const Tensor scaled = scaled_dot_product_attention(q, k, v, fused);
  check_close(scaled_dot_product_attention(q, k, v, composite), scaled, 1e-4, 1e-5, "dropout path with llama3 scaling");
  std::vector<double> a = to_vector(scaled), b = to_vector(unscaled);
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  INFO("max |scaled - unscaled| " << diff);
  CHECK(diff > 1e-3);
  // ... and is the same as a linear scaling by 8, which divides every frequency.
  AttentionOptions linear{.causal = true, .rope = {.theta = 10000.0, .scaling = {.kind = kernels::RopeScaling::Kind::linear,
                                                                               .factor = 8}}};
  check_close(scaled_dot_product_attention(q, k, v, linear), scaled, 1e-6, 1e-7, "llama3 with every frequency low = linear");
}

TEST_CASE("attention: fused forward and backward match the composite reference") {
  SECTION("causal, sequence lengths around the row block") {
    for (int64_t T : {1, 2, 5, 31, 32, 33, 37, 64, 70, 128})
      check_against_reference(2, 3, T, T, 16, 16, true);
  }
  SECTION("causal, GPT shapes") {
    check_against_reference(4, 4, 128, 128, 32, 32, true);
    check_against_reference(2, 6, 256, 256, 64, 64, true);
  }
  SECTION("non-causal, Tq != Tk and a value width unlike the key width") {
    check_against_reference(2, 2, 7, 13, 8, 5, false);
    check_against_reference(1, 3, 45, 1, 4, 6, false);
    check_against_reference(2, 1, 1, 40, 12, 12, false);
    check_against_reference(1, 2, 100, 67, 16, 24, false);
    // Head widths that are multiples of 16 (the register-tiled f32 path where built).
    check_against_reference(2, 2, 19, 45, 16, 32, false);
    check_against_reference(1, 2, 130, 3, 32, 16, false);
  }
}

// The f32 loops are chosen at run time with the GEMM kernel (kernels/cpu/gemm.h): the
// register-tiled AVX-512 loops with the AVX-512 kernel, the GEMM-based loops otherwise. Every
// choice this CPU can make gives the reference's results.
TEST_CASE("attention: every f32 kernel this CPU runs matches the reference") {
  using namespace weft::kernels::cpu;
  const SgemmKernel saved = sgemm_kernel();
  const Tensor q16 = random({1, 1, 4, 16}), q8 = random({1, 1, 4, 8});
  for (SgemmKernel kernel : {SgemmKernel::avx512, SgemmKernel::avx512_8x48, SgemmKernel::avx2, SgemmKernel::eigen}) {
    if (!sgemm_kernel_supported(kernel)) {
      std::printf("skipping attention with the %s kernel: this CPU does not have that instruction set\n",
                  sgemm_kernel_name(kernel));
      continue;
    }
    set_sgemm_kernel(kernel);
    INFO("kernel " << sgemm_kernel_name(kernel));
    CHECK(attention_uses_tiles(q16, q16) == is_avx512(kernel));
    // bf16 takes the bf16 tiles where the CPU has a bf16 kernel, else these f32 tiles on widened heads
    CHECK(attention_uses_tiles(q16.to(DType::bf16), q16) == (bf16_gemm_native() || is_avx512(kernel)));
    CHECK_FALSE(attention_uses_tiles(q8, q8));
    CHECK_FALSE(attention_uses_tiles(q16.to(kFloat64), q16.to(kFloat64)));
    for (int64_t T : {1, 7, 33, 70}) check_against_reference(2, 3, T, T, 16, 16, true);
    check_against_reference(2, 6, 256, 256, 64, 64, true);
    check_against_reference(2, 2, 19, 45, 16, 32, false);
    check_against_reference(1, 2, 130, 3, 32, 16, false);
  }
  set_sgemm_kernel(saved);
}

TEST_CASE("attention: large scores stay finite and rows sum to one") {
  // Scores of +-1000 overflow exp without the max subtraction.
  Tensor q = random({1, 2, 40, 8}, kFloat32, 30.0), k = random({1, 2, 40, 8}, kFloat32, 30.0);
  Tensor v = ones({1, 2, 40, 8});
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  // With v all ones every output is the row's probability sum.
  test::check_values(y.reshape({-1}), std::vector<double>(size_t(y.numel()), 1.0), 1e-5, 1e-5);
  check_close(y, reference(q, k, v, true), 1e-4, 1e-5, "large scores");
}

TEST_CASE("attention: the first causal row copies the first value") {
  Tensor q = random({2, 2, 9, 4}), k = random({2, 2, 9, 4}), v = random({2, 2, 9, 4});
  Tensor y = scaled_dot_product_attention(q, k, v, true);
  check_close(y.narrow(2, 0, 1), v.narrow(2, 0, 1), 1e-6, 1e-6, "row 0");
}

TEST_CASE("attention: strided views are read in place with the same result") {
  // The heads of a fused [B, T, 3d] projection: row stride 3d, head stride hd.
  const int64_t B = 2, T = 45, H = 3, hd = GENERATE(8, 16), d = H * hd;
  Tensor qkv = random({B, T, 3 * d});
  Tensor x = qkv.view({B, T, 3, H, hd});
  Tensor q = x.select(2, 0).transpose(1, 2), k = x.select(2, 1).transpose(1, 2), v = x.select(2, 2).transpose(1, 2);
  REQUIRE_FALSE(q.is_contiguous());
  Tensor strided = scaled_dot_product_attention(q, k, v, true);
  Tensor contiguous = scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(), true);
  check_close(strided, contiguous, 1e-6, 1e-7, "strided vs contiguous");
  // A key whose last dim is not unit-stride is copied first.
  Tensor kt = k.contiguous().transpose(2, 3).contiguous().transpose(2, 3);
  REQUIRE(kt.stride(-1) != 1);
  check_close(scaled_dot_product_attention(q, kt, v, true), contiguous, 1e-6, 1e-7, "column-major key");
  // The output is stored [B, T, H, hd].
  CHECK(strided.transpose(1, 2).is_contiguous());
}

TEST_CASE("attention: the fused-qkv form equals the split form, outputs and gradients") {
  const int64_t B = 3, T = 50, H = 4, hd = 8, d = H * hd;
  for (bool causal : {true, false}) {
    Tensor base = random({B, T, 3 * d});
    Tensor gy = random({B, T, d});
    Tensor a = base.clone().set_requires_grad();
    Tensor ya = scaled_dot_product_attention_qkv(a, H, causal);
    sum(ya * gy).backward();
    Tensor b = base.clone().set_requires_grad();
    Tensor xb = b.view({B, T, 3, H, hd});
    auto head = [&](int64_t i) { return xb.select(2, i).transpose(1, 2); };
    Tensor yb = reference(head(0), head(1), head(2), causal).transpose(1, 2).reshape({B, T, d});
    sum(yb * gy).backward();
    check_close(ya, yb, 1e-4, 1e-5, causal ? "qkv causal output" : "qkv full output");
    check_close(a.grad(), b.grad(), 1e-3, 1e-5, causal ? "qkv causal grad" : "qkv full grad");
  }
}

TEST_CASE("attention: gradcheck in f64") {
  auto leaf = [](const Shape& s) { return random(s, kFloat64).set_requires_grad(); };
  auto expect_ok = [](bool causal, const TensorList& in) {
    auto r = gradcheck(
        [causal](const TensorList& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); }, in);
    INFO(r.message);
    CHECK(r.ok);
  };
  expect_ok(true, {leaf({2, 2, 5, 3}), leaf({2, 2, 5, 3}), leaf({2, 2, 5, 3})});
  expect_ok(true, {leaf({1, 1, 1, 4}), leaf({1, 1, 1, 4}), leaf({1, 1, 1, 2})});
  expect_ok(true, {leaf({1, 2, 35, 2}), leaf({1, 2, 35, 2}), leaf({1, 2, 35, 2})});  // two row blocks
  expect_ok(false, {leaf({2, 1, 4, 3}), leaf({2, 1, 6, 3}), leaf({2, 1, 6, 2})});
  // Only some inputs needing grad.
  Tensor k = random({1, 2, 4, 3}, kFloat64), v = random({1, 2, 4, 3}, kFloat64);
  auto r = gradcheck([&](const TensorList& x) { return scaled_dot_product_attention(x[0], k, v, true); },
                     {leaf({1, 2, 4, 3})});
  INFO(r.message);
  CHECK(r.ok);
  Tensor qkv = leaf({2, 6, 12});  // d 4, 2 heads of 2
  auto rq = gradcheck([](const TensorList& x) { return scaled_dot_product_attention_qkv(x[0], 2, true); }, {qkv});
  INFO(rq.message);
  CHECK(rq.ok);
}

namespace {

double bf16(double x) { return double(float(BFloat16(float(x)))); }

// The arithmetic of the bf16 tiles (kernels/cpu/attention_avx512bf16.cpp) in f64, for bf16 q
// [B, H, T, E], k and v [B, Hkv, T, E] and upstream gradient g: q and k rotated (with the
// kernel's f32 tables) and rounded to bf16; scores, softmax and every sum exact; P and dS
// rounded to bf16 where they enter a product (the forward's P unnormalised, e^(s - max), each
// row of O divided by its sum after the product); each output rounded once. Returns y, dq, dk, dv.
TensorList bf16_model(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
                      double theta) {
  const int64_t B = q.size(0), H = q.size(1), Hkv = k.size(1), T = q.size(2), E = q.size(3), G = H / Hkv;
  const double scale = 1.0 / std::sqrt(double(E));
  const std::vector<double> Q = to_vector(q), K = to_vector(k), V = to_vector(v), Gr = to_vector(g);
  std::vector<double> cs, sn;
  if (theta > 0) {
    kernels::RopeTables t = kernels::rope_tables(theta, E, T, kFloat32, Device::cpu());
    cs = to_vector(t.cos), sn = to_vector(t.sin);
  }
  // Row t of x (E values at p) rotated by sign at position t, rounded to bf16.
  auto rotate = [&](const double* p, int64_t t, double sign, double* out) {
    for (int64_t i = 0; i < E; ++i) out[i] = p[i];
    if (theta > 0)
      for (int64_t i = 0; i < E / 2; ++i) {
        const double c = cs[size_t(t * E / 2 + i)], s = sign * sn[size_t(t * E / 2 + i)];
        out[i] = p[i] * c - p[i + E / 2] * s, out[i + E / 2] = p[i + E / 2] * c + p[i] * s;
      }
    for (int64_t i = 0; i < E; ++i) out[i] = bf16(out[i]);
  };
  std::vector<double> Y(Q.size()), DQ(Q.size()), DK(K.size(), 0.0), DV(V.size(), 0.0);
  const auto TE = static_cast<size_t>(T * E);
  std::vector<double> kr(TE), qr(TE), dkr(TE), row(static_cast<size_t>(E));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hk = 0; hk < Hkv; ++hk) {
      const size_t kv0 = size_t((b * Hkv + hk) * T * E);
      for (int64_t j = 0; j < T; ++j) rotate(&K[kv0 + size_t(j * E)], j, 1, &kr[size_t(j * E)]);
      std::fill(dkr.begin(), dkr.end(), 0.0);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        const size_t q0 = size_t((b * H + h) * T * E);
        for (int64_t i = 0; i < T; ++i) rotate(&Q[q0 + size_t(i * E)], i, 1, &qr[size_t(i * E)]);
        for (int64_t i = 0; i < T; ++i) {
          const int64_t n = causal ? i + 1 : T;
          std::vector<double> p(static_cast<size_t>(n));
          double mx = -INFINITY, sum = 0, d = 0;
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t e = 0; e < E; ++e) s += qr[size_t(i * E + e)] * kr[size_t(j * E + e)];
            p[size_t(j)] = s * scale, mx = std::max(mx, s * scale);
          }
          for (double& x : p) sum += (x = std::exp(x - mx));
          const std::vector<double> e = p;  // the forward's P: e^(s - max), unnormalised
          for (double& x : p) x /= sum;
          const double* gi = &Gr[q0 + size_t(i * E)];
          for (int64_t c = 0; c < E; ++c) {
            double o = 0;
            for (int64_t j = 0; j < n; ++j) o += bf16(e[size_t(j)]) * V[kv0 + size_t(j * E + c)];
            o /= sum;
            Y[q0 + size_t(i * E + c)] = bf16(o);
            d += gi[c] * bf16(o);
          }
          std::fill(row.begin(), row.end(), 0.0);
          for (int64_t j = 0; j < n; ++j) {
            double dpj = 0;
            for (int64_t c = 0; c < E; ++c) dpj += gi[c] * V[kv0 + size_t(j * E + c)];
            const double pb = bf16(p[size_t(j)]), ds = bf16(p[size_t(j)] * (dpj - d) * scale);
            for (int64_t c = 0; c < E; ++c) {
              DV[kv0 + size_t(j * E + c)] += pb * gi[c];
              dkr[size_t(j * E + c)] += ds * qr[size_t(i * E + c)];
              row[size_t(c)] += ds * kr[size_t(j * E + c)];
            }
          }
          rotate(row.data(), i, -1, &DQ[q0 + size_t(i * E)]);
        }
      }
      for (int64_t j = 0; j < T; ++j) rotate(&dkr[size_t(j * E)], j, -1, &DK[kv0 + size_t(j * E)]);
    }
  for (double& x : DV) x = bf16(x);
  auto tensor = [](const std::vector<double>& x, const Tensor& like) {
    return from_vector(x, like.shape(), {.dtype = kFloat64}).to(kFloat32);
  };
  return {tensor(Y, q), tensor(DQ, q), tensor(DK, k), tensor(DV, v)};
}

// How the operands of bf16_attention lie in memory: contiguous [B, H, T, E]; as the heads of
// a [B, T, H, E] tensor (rows H E apart, as a fused qkv projection's); or rows E + 1 apart
// (an odd stride, rows that do not start on 32-bit words).
enum class Layout { contiguous, heads_of_rows, odd_stride };

Tensor laid_out(const Tensor& x, Layout layout) {
  switch (layout) {
    case Layout::contiguous: return x.contiguous();
    case Layout::heads_of_rows: return x.transpose(1, 2).contiguous().transpose(1, 2);
    case Layout::odd_stride: return cat({x, zeros({x.size(0), x.size(1), x.size(2), 1}, {.dtype = x.dtype()})}, 3).narrow(3, 0, x.size(3));
  }
  return x;
}

// y, dq, dk, dv of the fused op on bf16 (or, with via_f32, on f32 copies rounded to bf16 at
// the end), as f32.
TensorList bf16_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
                          double theta, bool via_f32, Layout layout = Layout::contiguous) {
  const DType dt = via_f32 ? kFloat32 : DType::bf16;
  auto leaf = [&](const Tensor& x) { return laid_out(x.to(dt), layout).detach().set_requires_grad(); };
  Tensor qq = leaf(q), kk = leaf(k), vv = leaf(v);
  Tensor y = scaled_dot_product_attention(qq, kk, vv, AttentionOptions{.causal = causal, .rope = {.theta = theta}});
  sum(y * laid_out(g.to(dt), layout)).backward();
  auto out = [](const Tensor& t) { return t.detach().to(DType::bf16).to(kFloat32); };
  return {out(y), out(qq.grad()), out(kk.grad()), out(vv.grad())};
}

}  // namespace

TEST_CASE("attention: bf16 operands take the bf16 tiles, which round P and dS as the model does") {
  using kernels::cpu::BgemmKernel;
  if (!kernels::cpu::bf16_gemm_native()) {
    std::printf("skipping the bf16 attention tiles: this CPU has no AVX512_BF16 (or avx512 is not the GEMM "
                "kernel); bf16 attention runs in f32 (the 16-bit test below)\n");
    return;
  }
  struct Case {
    int64_t B, H, Hkv, T, E;
    bool causal;
    double theta;
  };
  const BgemmKernel saved = kernels::cpu::bgemm_kernel();
  // Every bf16 kernel this CPU runs: the vdpbf16ps register tiles and, with AMX, the tiles.
  for (BgemmKernel kernel : {BgemmKernel::avx512bf16, BgemmKernel::amx}) {
    if (!kernels::cpu::bgemm_kernel_supported(kernel)) {
      std::printf("skipping the %s bf16 attention: this CPU does not run it\n", kernels::cpu::bgemm_kernel_name(kernel));
      continue;
    }
    kernels::cpu::set_bgemm_kernel(kernel);
    // Odd and even lengths around the row block, the 8-row tiles and the 16-pair steps; whole
    // 32-row blocks of whole steps (read in place by the AMX tiles); grouped heads; rope.
    for (const Case& c : {Case{2, 4, 2, 37, 64, true, 10000.0}, Case{1, 2, 2, 33, 16, false, 0.0},
                          Case{2, 3, 1, 64, 32, true, 0.0}, Case{1, 2, 1, 9, 16, true, 500000.0},
                          Case{1, 2, 1, 96, 64, false, 10000.0}, Case{1, 4, 2, 128, 48, true, 0.0},
                          Case{2, 4, 2, 40, 48, true, 10000.0}}) {
      std::ostringstream name;
      name << kernels::cpu::bgemm_kernel_name(kernel) << " B" << c.B << " H" << c.H << " Hkv" << c.Hkv << " T" << c.T
           << " E" << c.E << (c.causal ? " causal" : " full") << " theta " << c.theta;
      INFO(name.str());
      auto bf = [](const Shape& s) { return random(s).to(DType::bf16); };
      Tensor q = bf({c.B, c.H, c.T, c.E}), k = bf({c.B, c.Hkv, c.T, c.E}), v = bf({c.B, c.Hkv, c.T, c.E});
      Tensor g = bf({c.B, c.H, c.T, c.E});
      const TensorList want = bf16_model(q, k, v, g, c.causal, c.theta);
      const TensorList got = bf16_attention(q, k, v, g, c.causal, c.theta, false);
      const TensorList f32 = bf16_attention(q, k, v, g, c.causal, c.theta, true);
      // Within one bf16 step of the model (its f32 sums and exp may land a value across a
      // rounding boundary); the f32 path misses the model's roundings by more.
      const char* what[] = {"y", "dq", "dk", "dv"};
      double f32_worst = 0;
      for (int i = 0; i < 4; ++i) {
        const double amax = to_vector(max(abs(want[size_t(i)])))[0];
        check_close(got[size_t(i)], want[size_t(i)], 1.0 / 128, 1e-3 * amax, std::string("bf16 tiles ") + what[i]);
        f32_worst = std::max(f32_worst, compare(f32[size_t(i)], want[size_t(i)], 1.0 / 128, 1e-3 * amax).worst);
      }
      CHECK(f32_worst > 1.0);
      // Rows that are not contiguous (heads of [B, T, H, E] rows, an odd row stride), with or
      // without rotation: the same answer.
      for (Layout layout : {Layout::heads_of_rows, Layout::odd_stride}) {
        INFO((layout == Layout::heads_of_rows ? "heads of [B, T, H, E] rows" : "rows E + 1 apart"));
        const TensorList strided = bf16_attention(q, k, v, g, c.causal, c.theta, false, layout);
        for (int i = 0; i < 4; ++i) {
          const double amax = to_vector(max(abs(want[size_t(i)])))[0];
          check_close(strided[size_t(i)], want[size_t(i)], 1.0 / 128, 1e-3 * amax, std::string("strided ") + what[i]);
        }
      }
    }
  }
  kernels::cpu::set_bgemm_kernel(saved);
}

// Where the bf16 tiles do not run (head dims not multiples of 16, f16, CPUs without
// AVX512_BF16), each task widens its own heads to f32 as it reads them: out, lse and the
// gradients have the bits of f32 attention on the 16-bit values (the backward's out is the
// rounded one), rounded once: with grouped key/value heads, whose dk and dv sum over the
// group before rounding, rotary embeddings and a strided, fused-qkv-like q. No f32 copy of a
// whole operand is made (test_fsdp_plan's bf16 runs on such CPUs count what a step allocates).
// bf16 with head dims that are multiples of 16 takes the f32 register tiles on AVX-512 CPUs
// without AVX512_BF16 (the f32 path those head dims take), the generic loops elsewhere.
TEST_CASE("attention: 16-bit inputs are computed in f32 where the bf16 tiles do not run") {
  struct Case {
    int64_t B, H, Hkv, T, E;
    bool causal;
    double theta;
  };
  std::vector<std::pair<DType, Case>> cases;
  for (DType dt : {DType::bf16, DType::f16})
    for (const Case& c : {Case{2, 2, 2, 33, 8, true, 0.0}, Case{2, 6, 2, 37, 8, true, 10000.0},
                          Case{1, 4, 1, 20, 24, false, 10000.0}})
      cases.push_back({dt, c});
  if (kernels::cpu::bf16_gemm_native())
    std::printf("skipping bf16 attention with head dims of 16 and 32 in f32: this CPU runs the bf16 tiles there\n");
  else
    for (const Case& c : {Case{2, 2, 2, 70, 16, true, 0.0}, Case{2, 6, 2, 37, 32, true, 10000.0},
                          Case{1, 4, 1, 20, 32, false, 10000.0}})
      cases.push_back({DType::bf16, c});
  for (const auto& item : cases) {
    const DType dt = item.first;
    const Case c = item.second;  // not a structured binding: the lambdas below capture it
      const std::string name = fmt::format("{} B{} H{} Hkv{} T{} E{}{} theta {}", dtype_name(dt), c.B, c.H, c.Hkv,
                                           c.T, c.E, c.causal ? " causal" : "", c.theta);
      // q as every third head of a [B, T, 3H, E] buffer: strides no contiguous tensor has
      Tensor q = random({c.B, c.T, 3 * c.H, c.E}, dt).narrow(2, 0, c.H).transpose(1, 2);
      Tensor k = random({c.B, c.Hkv, c.T, c.E}, dt), v = random({c.B, c.Hkv, c.T, c.E}, dt);
      Tensor g = random({c.B, c.H, c.T, c.E}, dt);
      const double scale = 1.0 / std::sqrt(double(c.E));
      const kernels::Rope rope{.theta = c.theta};
      auto f32 = [](const Tensor& t) { return t.to(kFloat32); };
      // Allocated by the 16-bit calls: their results only (the peak above what was live; the
      // rope tables, cached by the first call, are made beforehand).
      kernels::attention(q, k, v, c.causal, scale, rope);
      auto allocated = [](const std::function<int64_t()>& call) {
        const int64_t live = memory_stats().live_bytes;
        reset_peak_memory_stats();
        const int64_t results = call();
        return std::pair{memory_stats().peak_bytes - live, results};
      };
      Tensor y, lse, dq, dk, dv;
      auto [fwd_peak, fwd_results] = allocated([&] {
        std::tie(y, lse) = kernels::attention(q, k, v, c.causal, scale, rope);
        return y.nbytes() + lse.nbytes();
      });
      CHECK(fwd_peak == fwd_results);
      auto [y32, lse32] = kernels::attention(f32(q), f32(k), f32(v), c.causal, scale, rope);
      test::check_same_bits(y32.to(dt), y, name + " y");
      test::check_same_bits(lse32, lse, name + " lse");
      auto [bwd_peak, bwd_results] = allocated([&] {
        std::tie(dq, dk, dv) = kernels::attention_backward(g, q, k, v, y, lse, c.causal, scale, rope);
        return dq.nbytes() + dk.nbytes() + dv.nbytes();
      });
      CHECK(bwd_peak == bwd_results);
      auto [dq32, dk32, dv32] =
          kernels::attention_backward(f32(g), f32(q), f32(k), f32(v), f32(y), lse, c.causal, scale, rope);
      test::check_same_bits(dq32.to(dt), dq, name + " dq");
      test::check_same_bits(dk32.to(dt), dk, name + " dk");
      test::check_same_bits(dv32.to(dt), dv, name + " dv");
    }
}

TEST_CASE("attention: dropout falls back to the composite ops with the same draws") {
  Tensor q = random({2, 2, 12, 4}), k = random({2, 2, 12, 4}), v = random({2, 2, 12, 4});
  Generator g1(5), g2(5);
  Tensor y = scaled_dot_product_attention(q, k, v, true, 0.3, true, &g1);
  Tensor att = matmul(q, k.transpose(-2, -1)) * 0.5;
  Tensor rows = arange(0, 12.0, 1, {.dtype = kInt64}).view({12, 1});
  Tensor cols = arange(0, 12.0, 1, {.dtype = kInt64}).view({1, 12});
  att = masked_fill(att, cols > rows, -std::numeric_limits<double>::infinity());
  Tensor want = matmul(dropout(softmax(att, -1), 0.3, true, &g2), v);
  check_close(y, want, 1e-5, 1e-6, "dropout");
  // Dropout is off outside training and at p = 0.
  Tensor plain = scaled_dot_product_attention(q, k, v, true);
  check_close(scaled_dot_product_attention(q, k, v, true, 0.3, false), plain, 0, 0, "eval");
  // The fused-qkv form takes the same fallback and draws.
  Tensor base = random({2, 5, 24});
  Generator g3(9), g4(9);
  Tensor ya = scaled_dot_product_attention_qkv(base, 2, true, 0.5, true, &g3);
  Tensor xb = base.view({2, 5, 3, 2, 4});
  auto head = [&](int64_t i) { return xb.select(2, i).transpose(1, 2); };
  Tensor yb = scaled_dot_product_attention(head(0), head(1), head(2), true, 0.5, true, &g4);
  yb = yb.transpose(1, 2).reshape({2, 5, 8});
  check_close(ya, yb, 0, 0, "qkv dropout");
}

TEST_CASE("attention: nn::CausalSelfAttention uses the fused op and matches the composite path") {
  manual_seed(3);
  nn::TransformerConfig cfg{.d_model = 32, .n_head = 4};
  nn::CausalSelfAttention attn(cfg);
  Tensor x = random({3, 19, 32});
  Tensor gy = random({3, 19, 32});
  Tensor y = attn(x);
  sum(y * gy).backward();
  Tensor gw = attn.c_attn->weight.grad().clone();
  attn.zero_grad();
  // The composite path by hand, with the module's own weights.
  Tensor qkv = linear(x, attn.c_attn->weight, attn.c_attn->bias).view({3, 19, 3, 4, 8});
  auto head = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };
  Tensor h = reference(head(0), head(1), head(2), true).transpose(1, 2).reshape({3, 19, 32});
  Tensor want = linear(h, attn.c_proj->weight, attn.c_proj->bias);
  sum(want * gy).backward();
  check_close(y, want, 1e-4, 1e-6, "module output");
  check_close(gw, attn.c_attn->weight.grad(), 1e-3, 1e-6, "c_attn.weight grad");
}

TEST_CASE("attention: bad arguments raise errors naming the problem") {
  Tensor q = random({2, 2, 5, 4}), k = random({2, 2, 5, 4}), v = random({2, 2, 5, 4});
  CHECK_THROWS_WITH(scaled_dot_product_attention(q.view({4, 5, 4}), k, v),
                    Contains("4-D [batch, heads, seq, head_dim]") && Contains("f32[4, 5, 4]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, random({2, 2, 5, 3}), v),
                    Contains("same head_dim") && Contains("[2, 2, 5, 3]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, random({2, 2, 6, 4})),
                    Contains("same sequence length") && Contains("[2, 2, 6, 4]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, random({2, 3, 5, 4}), v),
                    Contains("key and value need the same number of heads") && Contains("[2, 3, 5, 4]"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(random({2, 3, 5, 4}), k, v), Contains("dividing the query's"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, AttentionOptions{.rope = {.theta = -1.0}}),
                    Contains("rope theta must be finite and positive"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(random({2, 2, 5, 3}), random({2, 2, 5, 3}), random({2, 2, 5, 3}),
                                                 AttentionOptions{.rope = {.theta = 10.0}}),
                    Contains("even head dim"));
  CHECK_THROWS_WITH(rotary_embedding(random({2, 5, 3}), 10.0), Contains("even head dim"));
  CHECK_THROWS_WITH(
      scaled_dot_product_attention(random({2, 2, 3, 4}), random({2, 2, 6, 4}), random({2, 2, 6, 4}), true),
      Contains("causal attention needs as many queries as keys"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k.to(kFloat64), v), Contains("must share a dtype"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q.to(kInt64), k, v),
                    Contains("query must be a floating tensor") && Contains("i64"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, k, v, true, 1.5),
                    Contains("dropout probability must be in [0, 1]"));
  // The dropout fallback checks the same things.
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, random({2, 2, 5, 3}), v, false, 0.1), Contains("same head_dim"));
  CHECK_THROWS_WITH(scaled_dot_product_attention(q, random({2, 2, 0, 4}), random({2, 2, 0, 4})),
                    Contains("no positions to attend to"));
  CHECK_THROWS_WITH(scaled_dot_product_attention_qkv(random({2, 5, 25}), 2), Contains("3 x n_head 2"));
  CHECK_THROWS_WITH(scaled_dot_product_attention_qkv(random({10, 24}), 2), Contains("[batch, seq, 3 * d_model]"));
  // Kernel level: saved tensors that do not fit.
  auto [out, lse] = kernels::attention(q, k, v, true, 0.5);
  CHECK_THROWS_WITH(kernels::attention_backward(out, q, k, v, out, lse.to(kFloat64), true, 0.5),
                    Contains("saved log-sum-exp"));
  CHECK_THROWS_WITH(kernels::attention_backward(random({2, 2, 4, 4}), q, k, v, out, lse, true, 0.5),
                    Contains("grad and out must be"));
}

TEST_CASE("attention: empty batches give empty results") {
  Tensor q = random({0, 2, 5, 4}).set_requires_grad();
  Tensor y = scaled_dot_product_attention(q, random({0, 2, 5, 4}), random({0, 2, 5, 4}), true);
  CHECK(y.shape() == Shape({0, 2, 5, 4}));
  sum(y).backward();
  CHECK(q.grad().shape() == q.shape());
  // No queries but some keys: the key and value gradients are zero.
  Tensor k = random({1, 1, 3, 4}).set_requires_grad();
  Tensor y2 = scaled_dot_product_attention(random({1, 1, 0, 4}), k, random({1, 1, 3, 4}), false);
  CHECK(y2.shape() == Shape({1, 1, 0, 4}));
  sum(y2).backward();
  test::check_values(k.grad().reshape({-1}), std::vector<double>(12, 0.0));
}

TEST_CASE("both overloads of scaled_dot_product_attention are not causal unless asked, as torch's is_causal") {
  const Tensor q = random({1, 2, 4, 8}), k = random({1, 2, 4, 8}), v = random({1, 2, 4, 8});
  const Tensor plain = scaled_dot_product_attention(q, k, v), with_options = scaled_dot_product_attention(q, k, v, AttentionOptions{});
  auto diff = [](const Tensor& a, const Tensor& b) { return max(abs(sub(a, b))).item(); };
  CHECK(diff(plain, with_options) == 0);
  CHECK(diff(plain, scaled_dot_product_attention(q, k, v, true)) > 1e-3);  // causal is another result
}
