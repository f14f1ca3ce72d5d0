// The op profiler (core/op_profiler.h): every kernel entry point and every cast is a row with
// its calls, FLOPs and operand bytes while it runs and not after; a row's time excludes the
// ops nested in it.
#include "core/generator.h"
#include "core/op_profiler.h"
#include "kernels/linalg.h"
#include "kernels/nn.h"
#include "test_util.h"

using namespace weft;

namespace {

const op_profiler::Row* find_row(const std::vector<op_profiler::Row>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  std::string names;
  for (const auto& r : rows) names += " [" + r.name + "]";
  FAIL_CHECK("no row '" << name << "' among" << names);
  return nullptr;
}

}  // namespace

TEST_CASE("op profiler: each kernel and cast is a row with its calls, FLOPs and bytes, only while it runs") {
  Generator gen(1);
  Tensor a = randn({64, 32}, {}, &gen), b = randn({32, 48}, {}, &gen);
  op_profiler::start();
  Tensor c = kernels::matmul(a, b);
  kernels::matmul(a, b.t().contiguous().t());  // b read transposed: a row of its own
  kernels::matmul(a, b);
  Tensor h = c.to(DType::bf16);
  Tensor s = kernels::softmax(c, -1);
  op_profiler::stop();
  kernels::matmul(a, b);  // not counted
  const auto rows = op_profiler::rows();
  for (size_t i = 1; i < rows.size(); ++i) CHECK(rows[i - 1].seconds >= rows[i].seconds);
  if (auto* mm = find_row(rows, "matmul 64x48x32 NN f32")) {
    CHECK(mm->calls == 2);
    CHECK(mm->flops == 2.0 * 2 * 64 * 48 * 32);
    CHECK(mm->bytes == 2.0 * (64 * 32 + 32 * 48 + 64 * 48) * 4);
    CHECK(mm->seconds > 0);
  }
  if (auto* mt = find_row(rows, "matmul 64x48x32 NT f32")) CHECK(mt->calls == 1);
  if (auto* cast = find_row(rows, "cast f32 -> bf16")) {
    CHECK(cast->calls == 1);
    CHECK(cast->flops == 0);
    CHECK(cast->bytes == 64.0 * 48 * (4 + 2));
  }
  if (auto* sm = find_row(rows, "softmax f32")) CHECK(sm->bytes == 2.0 * 64 * 48 * 4);
  op_profiler::start();
  CHECK(op_profiler::rows().empty());  // start() clears
  op_profiler::stop();
}

TEST_CASE("op profiler: a row's time excludes the ops nested in it") {
  Generator gen(2);
  Tensor a = randn({512, 512}, {}, &gen), out = empty({512, 512});
  // Into one output made before: a fresh output per product would put its allocation (fresh pages,
  // outside the kernel's span: in a sanitizer build, whose allocator keeps no cache, on every call)
  // into the outer row's own time, and on a loaded machine nearly all of it.
  kernels::gemm(a, false, a, false, out);
  op_profiler::start();
  {
    op_profiler::Span outer("outer", 0, 0);
    for (int i = 0; i < 4; ++i) kernels::gemm(a, false, a, false, out);
  }
  op_profiler::stop();
  const auto rows = op_profiler::rows();
  const auto* outer = find_row(rows, "outer");
  const auto* mm = find_row(rows, "gemm 512x512x512 NN f32");
  REQUIRE(outer);
  REQUIRE(mm);
  INFO("outer " << outer->seconds << " s, its matmuls " << mm->seconds << " s");
  // Counted with its matmuls, outer would take longer than they do; alone it is the loop and
  // the entry points' own work (slow in a sanitizer build, but far below four 512^3 products).
  CHECK(outer->seconds < 0.5 * mm->seconds);
}
