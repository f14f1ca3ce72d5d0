// kernels: matmul and gemm entry points: shape rules, checks, output allocation and the
// dispatch to the device's backend. The CPU loops are in kernels/cpu/gemm.cpp.
#include "kernels/linalg.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/copy.h"
#include "kernels/backend.h"
#include "kernels/reduce.h"

namespace weft::kernels {
namespace {

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  WEFT_CHECK(a.defined() && b.defined(), "{}: got an undefined tensor ({} and {})", op, tensor_desc(a),
             tensor_desc(b));
  WEFT_CHECK(a.device() == b.device(), "{}: operands are on different devices: {} and {}", op, tensor_desc(a),
             tensor_desc(b));
  WEFT_CHECK(a.dtype() == b.dtype(), "{}: operands have different dtypes: {} and {}", op, tensor_desc(a),
             tensor_desc(b));
  WEFT_CHECK(is_floating(a.dtype()), "{}: expects floating tensors (f32, f64, bf16, f16), got {} and {}", op,
             tensor_desc(a), tensor_desc(b));
}

std::atomic<bool> g_allow_tf32{[] {
  const char* env = std::getenv("WEFT_ALLOW_TF32");
  return env && std::strcmp(env, "1") == 0;
}()};

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

Tensor matmul(const Tensor& a_, const Tensor& b_) {
  // Kernels never record autograd history: work on detached handles.
  Tensor a = a_.defined() ? a_.detach() : a_, b = b_.defined() ? b_.detach() : b_;
  check_operands("matmul", a, b);
  WEFT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dim, got {} and {}",
             tensor_desc(a), tensor_desc(b));
  const KernelBackend& backend = kernel_backend(a.device(), "matmul");
  TensorOptions opts{.dtype = a.dtype(), .device = a.device()};
  if (a.dim() == 1 && b.dim() == 1) {
    WEFT_CHECK(a.size(0) == b.size(0), "matmul: 1-D operands differ in length: {} and {}", tensor_desc(a),
               tensor_desc(b));
    Tensor out = empty({}, opts);
    backend.dot(a, b, out);
    return out;
  }
  // A 1-D operand becomes a row (left) or column (right) matrix; its dim is dropped after.
  Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  WEFT_CHECK(k == b2.size(-2), "matmul: inner dims differ: {} @ {} (a's last dim {} vs b's {} dim {})",
             tensor_desc(a), tensor_desc(b), k, b.dim() == 1 ? "only" : "second-to-last", b2.size(-2));
  Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                 Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
  Shape full = batch;
  full.push_back(m);
  full.push_back(n);
  Tensor out = empty(full, opts);
  backend.matmul(a2, b2, out);
  if (a.dim() == 1) out = out.squeeze(-2);
  if (b.dim() == 1) out = out.squeeze(-1);
  return out;
}

void gemm(const Tensor& a_, bool trans_a, const Tensor& b_, bool trans_b, const Tensor& out, double alpha,
          double beta, const Tensor& bias, const Tensor& a_sums) {
  Tensor a = a_.defined() ? a_.detach() : a_, b = b_.defined() ? b_.detach() : b_;
  check_operands("gemm", a, b);
  WEFT_CHECK(a.dim() == 2 && b.dim() == 2, "gemm: expects 2-D operands, got {} and {}", tensor_desc(a),
             tensor_desc(b));
  const bool widen = is_16bit(a.dtype()) && out.defined() && out.dtype() == kFloat32;
  WEFT_CHECK(out.defined() && (out.dtype() == a.dtype() || widen) && out.device() == a.device(),
             "gemm: out {} must match the operands' dtype and device ({}), or be f32 for 16-bit operands",
             tensor_desc(out), tensor_desc(a));
  Tensor A = trans_a ? a.t() : a, B = trans_b ? b.t() : b;
  WEFT_CHECK(A.size(1) == B.size(0), "gemm: inner dims differ: op(a) is [{}, {}], op(b) is [{}, {}]",
             A.size(0), A.size(1), B.size(0), B.size(1));
  WEFT_CHECK(out.dim() == 2 && out.size(0) == A.size(0) && out.size(1) == B.size(1) && out.is_contiguous(),
             "gemm: out {} must be a contiguous [{}, {}] matrix", tensor_desc(out), A.size(0), B.size(1));
  WEFT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == out.size(1) && bias.dtype() == out.dtype() &&
                                 bias.device() == out.device() && beta == 0.0),
             "gemm: bias {} must be a 1-D [{}] of out's dtype and device ({}), with beta 0 (got {})",
             tensor_desc(bias), out.size(1), tensor_desc(out), beta);
  WEFT_CHECK(!a_sums.defined() || (a_sums.dim() == 1 && a_sums.size(0) == A.size(0) && a_sums.dtype() == a.dtype() &&
                                   a_sums.device() == a.device() && a_sums.is_contiguous()),
             "gemm: a_sums {} must be a contiguous 1-D [{}] of a's dtype and device ({})", tensor_desc(a_sums),
             A.size(0), tensor_desc(a));
  const Tensor bias_c = bias.defined() ? bias.detach().contiguous() : bias;
  if (!kernel_backend(a.device(), "gemm").gemm(A, B, out, alpha, beta, bias_c, a_sums) && a_sums.defined())
    copy_elements(a_sums, reduce(ReduceOp::sum, a, {trans_a ? 0 : 1}, false));  // the backend left them
}

}  // namespace weft::kernels
