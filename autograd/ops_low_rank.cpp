// autograd: the low-rank adapted linear (LoRA's layer, nn/lora.h) as one node:
//   y = x W^T + bias + (scale * xa A^T) B^T,   xa: the adapter's input (x, or x after dropout)
// What the node saves over linear(x, W, bias) + linear(linear(xa, A) * scale, B): under autocast x is cast to 16 bits
// once for both products when xa is x (and kept once for backward); scale multiplies the rank-r activation as its
// product is stored; B's product joins the base's (one product of [x | h] and [W | B] where both are cast anyway, else
// beta 1 into y); in backward x's two gradient products are summed in one buffer, the scaled dY B rounded once.
// Operands whose dtypes differ after autocast take that composition instead.
#include <array>
#include <optional>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "autograd/linear_parts.h"
#include "kernels/linalg.h"
#include "kernels/reduce.h"

namespace weft {

using autograd::needs_grad;
using autograd::product;
using autograd::record;
using autograd::TensorList;
namespace k = kernels;

namespace {

void check_low_rank(const Tensor& x, const Tensor& xa, const Tensor& weight, const Tensor& a, const Tensor& b) {
  WEFT_CHECK(weight.dim() == 2 && a.dim() == 2 && b.dim() == 2,
             "low_rank_linear: weight, A and B must be 2-D, got {}, {} and {}", tensor_desc(weight), tensor_desc(a),
             tensor_desc(b));
  WEFT_CHECK(a.size(1) == weight.size(1) && b.size(0) == weight.size(0) && b.size(1) == a.size(0),
             "low_rank_linear: A {} and B {} do not fit weight {} (expected A [r, {}] and B [{}, r])", tensor_desc(a),
             tensor_desc(b), tensor_desc(weight), weight.size(1), weight.size(0));
  WEFT_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1) && xa.shape() == x.shape(),
             "low_rank_linear: input {} (adapter input {}) does not match weight {} (last dim must be {})",
             tensor_desc(x), tensor_desc(xa), tensor_desc(weight), weight.size(1));
}

// y2 = [x | h | 0] [W | B | 0]^T + bias, one product of depth in + r rounded up to a multiple of 32 (whole AMX tiles,
// read in place), h = scale * xa A^T: x and W are cast into the joined operands, so y is written once rather than
// written and read back to add h B^T. Sets the views of the joined operands that backward reads (x2 and h of [x | h], w
// and b2 of [W | B]); xa2 is x2 when xa is x.
void joined_product(const Tensor& x, const Tensor& xa, const Tensor& weight, const Tensor& bias2, const Tensor& a2,
                    const Tensor& b, double scale, const Tensor& y2, Tensor& x2, Tensor& xa2, Tensor& w, Tensor& b2,
                    Tensor& h) {
  const int64_t in = weight.size(1), r = b.size(1), depth = (in + r + 31) / 32 * 32, rows = y2.size(0);
  const TensorOptions opts{.dtype = y2.dtype(), .device = y2.device()};
  Tensor xh = empty({rows, depth}, opts), wb = empty({weight.size(0), depth}, opts);
  x2 = xh.narrow(1, 0, in);
  x2.copy_(autograd::as_rows(x.detach()));
  xa2 = xa.impl() == x.impl() ? x2 : autocast_input(autograd::as_rows(xa.detach()));
  h = xh.narrow(1, in, r);
  h.copy_(product(xa2, false, a2, true, y2.dtype(), scale));
  w = wb.narrow(1, 0, in);
  w.copy_(weight.detach());
  b2 = wb.narrow(1, in, r);
  b2.copy_(b.detach());
  xh.narrow(1, in + r, depth - in - r).zero_();  // (no columns when in + r is whole tiles)
  wb.narrow(1, in + r, depth - in - r).zero_();
  k::gemm(xh, false, wb, true, y2, 1.0, 0.0, bias2);
}

}  // namespace

Tensor low_rank_linear(const Tensor& x, const Tensor& xa, const Tensor& weight, const Tensor& bias, const Tensor& a,
                       const Tensor& b, double scale) {
  check_low_rank(x, xa, weight, a, b);
  const int64_t in = weight.size(1), out_f = weight.size(0);
  const bool one_input = xa.impl() == x.impl();
  const std::optional<DType> cast = autocast_dtype();
  const auto in_dtype = [&](const Tensor& t) { return cast && is_floating(t.dtype()) ? *cast : t.dtype(); };
  const DType dt = in_dtype(x);
  if (in_dtype(xa) != dt || in_dtype(weight) != dt || in_dtype(a) != dt || in_dtype(b) != dt)
    return linear(x, weight, bias) + linear(linear(xa, a) * scale, b);
  Tensor x2, xa2, w, b2, h, y2 = empty({x.numel() / in, out_f}, {.dtype = dt, .device = x.device()});
  const Tensor a2 = autocast_input(a.detach()), bias2 = bias.defined() ? bias.detach().to(dt) : Tensor();
  if (x.dtype() != dt && weight.dtype() != dt) {  // x and W are cast anyway: into [x | h] and [W | B]
    joined_product(x, one_input ? x : xa, weight, bias2, a2, b, scale, y2, x2, xa2, w, b2, h);
  } else {
    x2 = autocast_input(autograd::as_rows(x.detach()));
    xa2 = one_input ? x2 : autocast_input(autograd::as_rows(xa.detach()));
    w = autocast_input(weight.detach());
    b2 = autocast_input(b.detach());
    h = product(xa2, false, a2, true, dt, scale);  // [rows, r]
    k::gemm(x2, false, w, true, y2, 1.0, 0.0, bias2);
    k::gemm(h, false, b2, true, y2, 1.0, 1.0);
  }
  Tensor y = y2.view(autograd::with_last(x.shape(), out_f));
  TensorList inputs{x, weight, a, b, bias.defined() ? bias : Tensor(), one_input ? Tensor() : xa};
  if (!needs_grad({&x, &xa, &weight, &bias, &a, &b})) return y;
  auto wants = [](const Tensor& t) { return t.defined() && t.requires_grad(); };
  record("LowRankLinearBackward", inputs, {y},
         [x2, xa2, w, a2, b2, h, scale, one_input, x_shape = x.shape(), x_dtype = x.dtype(), xa_dtype = xa.dtype(),
          w_dtype = weight.dtype(), a_dtype = a.dtype(), b_dtype = b.dtype(), bias_dtype = bias.defined() ? bias.dtype() : dt,
          want = std::array<bool, 6>{wants(x), wants(weight), wants(a), wants(b), wants(bias), !one_input && wants(xa)}](
             const TensorList& g) -> TensorList {
           Tensor g2 = autograd::as_rows(g[0]);
           TensorList r(6);
           Tensor dh = product(g2, false, b2, false, h.dtype(), scale);  // d(y)/d(xa A^T): scale dY B
           if (want[3]) r[3] = product(g2, true, h, false, b_dtype);
           if (want[2]) r[2] = product(dh, true, xa2, false, a_dtype);
           if (want[1]) r[1] = product(g2, true, x2, false, w_dtype);
           if (want[4]) r[4] = k::reduce(k::ReduceOp::sum, g2, {0}, false).to(bias_dtype);
           if (want[0]) {
             Tensor dx = product(g2, false, w, false, x_dtype);
             if (one_input) k::gemm(dh, false, a2, false, dx, 1.0, 1.0);
             r[0] = dx.view(x_shape);
           }
           if (want[5]) r[5] = product(dh, false, a2, false, xa_dtype).view(x_shape);
           return r;
         });
  return y;
}

}  // namespace weft
