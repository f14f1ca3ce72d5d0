// autograd: matmul and linear with their gradients. Batched operands against a 2-D weight
// fold the batch into rows, so the weight gradient is one GEMM rather than a batched GEMM followed by a sum.
#include "autograd/autocast.h"
#include "autograd/kept_outputs.h"
#include "autograd/ops.h"
#include "autograd/linear_parts.h"
#include "kernels/elementwise.h"
#include "kernels/linalg.h"
#include "kernels/reduce.h"

namespace weft {

using autograd::needs_grad;
using autograd::record;
using autograd::TensorList;
namespace k = kernels;

namespace {

Tensor mT(const Tensor& t) { return t.transpose(-2, -1); }

// a^T @ g for a 2-D b, laid out as b is: when b is a transposed view (a weight read as W^T,
// as a tied head reads the embedding), (g^T @ a)^T, so that W's gradient arrives contiguous
// rather than as a transpose that a later copy or sum would read column by column.
Tensor weight_grad(const Tensor& a, const Tensor& g, const Tensor& b) {
  if (b.stride(0) == 1 && b.stride(1) != 1) return mT(k::matmul(mT(g), a));
  return k::matmul(mT(a), g);
}

// Gradients of c = a @ b for a, b with at least 2 dims (batch dims broadcast).
std::pair<Tensor, Tensor> matmul_grads(const Tensor& g, const Tensor& a, const Tensor& b, bool need_a,
                                       bool need_b) {
  Tensor ga, gb;
  if (a.dim() >= 2 && b.dim() == 2) {
    Tensor g2 = autograd::as_rows(g);
    if (need_a) ga = k::matmul(g2, b.t()).reshape(a.shape());
    if (need_b) gb = weight_grad(autograd::as_rows(a), g2, b);
    return {ga, gb};
  }
  if (need_a) ga = k::sum_to(k::matmul(g, mT(b)), a.shape());
  if (need_b) gb = k::sum_to(k::matmul(mT(a), g), b.shape());
  return {ga, gb};
}

}  // namespace

Tensor matmul(const Tensor& a_, const Tensor& b_) {
  const Tensor a = autocast_input(a_), b = autocast_input(b_);
  Tensor out = autograd::kept_op("matmul", [&] { return TensorList{k::matmul(a, b)}; })[0];
  if (needs_grad({&a, &b})) {
    record("MatmulBackward", {a, b}, {out},
           [a = a.detach(), b = b.detach(), ra = a.requires_grad(), rb = b.requires_grad()](
               const TensorList& g) -> TensorList {
             if (a.dim() == 1 && b.dim() == 1) {  // dot product
               return {ra ? k::binary(k::BinaryOp::mul, g[0], b) : Tensor(),
                       rb ? k::binary(k::BinaryOp::mul, g[0], a) : Tensor()};
             }
             // Promote vectors to matrices as matmul does, then undo it on the gradients.
             Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
             Tensor b2 = b.dim() == 1 ? b.unsqueeze(-1) : b;
             Tensor g2 = g[0];
             if (a.dim() == 1) g2 = g2.unsqueeze(-2);
             if (b.dim() == 1) g2 = g2.unsqueeze(-1);
             auto [ga, gb] = matmul_grads(g2, a2, b2, ra, rb);
             if (ga.defined() && ga.shape() != a.shape()) ga = ga.reshape(a.shape());
             if (gb.defined() && gb.shape() != b.shape()) gb = gb.reshape(b.shape());
             return {ga, gb};
           });
  }
  return out;
}

// Under autocast the product runs on 16-bit copies of x and the weight (kept for the
// backward, half the f32 activation), and the input gradients are computed from them straight
// into x's and the weight's own dtypes (f32 sums, not rounded to 16 bits).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  WEFT_CHECK(weight.dim() == 2, "linear: weight must be 2-D [out, in], got {}", tensor_desc(weight));
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1),
             "linear: input {} does not match weight {} (last input dim must equal in_features {})",
             tensor_desc(x), tensor_desc(weight), weight.size(1));
  WEFT_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
             "linear: bias {} does not match weight {} (expected [{}])", tensor_desc(bias),
             tensor_desc(weight), weight.size(0));
  const int64_t out_f = weight.size(0);
  Tensor x2 = autocast_input(autograd::as_rows(x.detach())), w = autocast_input(weight.detach());
  const DType dt = x2.dtype();
  Tensor y2 = autograd::kept_op("linear", [&] {
    if (!bias.defined()) return TensorList{k::matmul(x2, w.t())};
    Tensor y = empty({x2.size(0), out_f}, {.dtype = dt, .device = x.device()});
    k::gemm(x2, false, w, true, y, 1.0, 0.0, bias.detach().to(dt));  // the bias in y's dtype, added as y is stored
    return TensorList{y};
  })[0];
  Tensor y = y2.view(autograd::with_last(x.shape(), out_f));
  if (needs_grad({&x, &weight, &bias})) {
    TensorList inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    record("LinearBackward", inputs, {y},
           [x2, w, x_shape = x.shape(), x_dtype = x.dtype(), w_dtype = weight.dtype(),
            b_dtype = bias.defined() ? bias.dtype() : dt, rx = x.requires_grad(), rw = weight.requires_grad(),
            rb = bias.defined() && bias.requires_grad(), has_bias = bias.defined()](const TensorList& g) -> TensorList {
             Tensor g2 = autograd::as_rows(g[0]);
             TensorList r(has_bias ? 3 : 2);
             // A product writes its operands' dtype or f32: an input autocast read in another (f16) gets f32, converted.
             auto out = [&](DType want) { return want == g2.dtype() ? want : kFloat32; };
             if (rx) r[0] = autograd::product(g2, false, w, false, out(x_dtype)).to(x_dtype).view(x_shape);
             // The bias gradient, dY's column sums, taken as dY^T is packed for the weight's.
             Tensor gb = rb && rw ? empty({w.size(0)}, {.dtype = g2.dtype(), .device = g2.device()}) : Tensor();
             if (rw) r[1] = autograd::product(g2, true, x2, false, out(w_dtype), 1.0, gb).to(w_dtype);
             if (rb) r[2] = (rw ? gb : k::reduce(k::ReduceOp::sum, g2, {0}, false)).to(b_dtype);
             return r;
           });
  }
  return y;
}

}  // namespace weft
