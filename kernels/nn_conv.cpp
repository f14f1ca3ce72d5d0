// kernels: entry points of conv2d and max_pool2d (NCHW, or CHW for one image): shape rules, checks, allocation and
// dispatch to the device's backend. The convolution loops take f32/f64; 16-bit tensors are converted around them.
#include "kernels/backend.h"
#include "kernels/nn.h"
#include "kernels/nn_checks.h"

namespace weft::kernels {
using namespace checks;
namespace {

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}
constexpr int64_t kMaxSide = int64_t(1) << 30;  // padding and windows: sums of sides stay far inside int64

void check_conv_params(const Conv2dParams& p) {
  WEFT_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0 && p.pad_h <= kMaxSide &&
                 p.pad_w <= kMaxSide,
             "conv2d: stride must be >= 1 and padding in [0, 2^30], got stride ({}, {}) padding ({}, {})",
             p.stride_h, p.stride_w, p.pad_h, p.pad_w);
}

// Checks x [N, C, H, W] against weight [O, C, kh, kw] and returns the output shape.
Shape conv_shape(const char* op, const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  check_float(op, x, "input");
  check_float(op, weight, "weight");
  check_device(op, x, weight);
  check_conv_params(p);
  WEFT_CHECK(x.dim() == 4 && weight.dim() == 4 && x.size(1) == weight.size(1) && x.size(2) >= 1 && x.size(3) >= 1,
             "{}: input {} must be [N, C, H, W] (H, W >= 1) and weight {} [O, C, kh, kw] with the same C", op,
             tensor_desc(x), tensor_desc(weight));
  WEFT_CHECK(x.dtype() == weight.dtype(), "{}: dtypes differ: input {} and weight {}", op, tensor_desc(x),
             tensor_desc(weight));
  int64_t ho = conv_out_size(x.size(2), weight.size(2), p.stride_h, p.pad_h);
  int64_t wo = conv_out_size(x.size(3), weight.size(3), p.stride_w, p.pad_w);
  WEFT_CHECK(ho >= 1 && wo >= 1 && x.size(2) + 2 * p.pad_h >= weight.size(2) &&
                 x.size(3) + 2 * p.pad_w >= weight.size(3),
             "{}: input {} padded by ({}, {}) is smaller than the kernel of weight {}", op, tensor_desc(x),
             p.pad_h, p.pad_w, tensor_desc(weight));
  return {x.size(0), weight.size(0), ho, wo};
}

}  // namespace

Tensor conv2d(const Tensor& x_, const Tensor& weight_, const Tensor& bias_, const Conv2dParams& p) {
  Tensor x = plain(x_), weight = plain(weight_), bias = plain(bias_);
  if (x.defined() && x.dim() == 3) return conv2d(x.unsqueeze(0), weight, bias, p).squeeze(0);
  Shape shape = conv_shape("conv2d", x, weight, p);
  if (bias.defined()) {
    check_device("conv2d", x, bias);
    WEFT_CHECK(bias.dtype() == x.dtype() && bias.dim() == 1 && bias.size(0) == weight.size(0),
               "conv2d: bias {} must be [{}] of dtype {}", tensor_desc(bias), weight.size(0),
               dtype_name(x.dtype()));
  }
  const KernelBackend& backend = kernel_backend(x.device(), "conv2d");
  DType ct = stats_dtype(x.dtype());
  Tensor out = empty(shape, {.dtype = ct, .device = x.device()});
  backend.conv2d(x.to(ct).contiguous(), weight.to(ct).contiguous(),
                 bias.defined() ? bias.to(ct).contiguous() : bias, p, out);
  return out.to(x.dtype());
}

std::tuple<Tensor, Tensor, Tensor> conv2d_backward(const Tensor& grad_, const Tensor& x_,
                                                   const Tensor& weight_, bool has_bias,
                                                   const Conv2dParams& p) {
  Tensor grad = plain(grad_), x = plain(x_), weight = plain(weight_);
  if (x.defined() && x.dim() == 3 && grad.defined() && grad.dim() == 3) {
    auto [dx, dw, db] = conv2d_backward(grad.unsqueeze(0), x.unsqueeze(0), weight, has_bias, p);
    return {dx.squeeze(0), dw, db};
  }
  const char* op = "conv2d_backward";
  Shape shape = conv_shape(op, x, weight, p);
  check_float(op, grad, "grad");
  check_device(op, grad, x);
  WEFT_CHECK(grad.shape() == shape && grad.dtype() == x.dtype(),
             "{}: grad {} must be {}{}, the output of input {}", op, tensor_desc(grad), dtype_name(x.dtype()),
             shape_str(shape), tensor_desc(x));
  const KernelBackend& backend = kernel_backend(x.device(), op);
  DType ct = stats_dtype(x.dtype());
  TensorOptions opts{.dtype = ct, .device = x.device()};
  Tensor dx = zeros(x.shape(), opts), dweight = empty(weight.shape(), opts);
  Tensor dbias = has_bias ? empty({weight.size(0)}, opts) : Tensor();
  backend.conv2d_backward(grad.to(ct).contiguous(), x.to(ct).contiguous(), weight.to(ct).contiguous(), p, dx,
                          dweight, dbias);
  return {dx.to(x.dtype()), dweight.to(x.dtype()), has_bias ? dbias.to(x.dtype()) : dbias};
}

std::pair<Tensor, Tensor> max_pool2d(const Tensor& x_, const Pool2dParams& p) {
  Tensor x = plain(x_);
  check_float("max_pool2d", x, "input");
  WEFT_CHECK((x.dim() == 3 || x.dim() == 4) && x.size(-2) >= 1 && x.size(-1) >= 1,
             "max_pool2d: input must be [N, C, H, W] or [C, H, W] (H, W >= 1), got {}", tensor_desc(x));
  WEFT_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.kernel_h <= kMaxSide && p.kernel_w <= kMaxSide &&
                 p.stride_h >= 1 && p.stride_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h &&
                 2 * p.pad_w <= p.kernel_w,
             "max_pool2d: need 1 <= kernel <= 2^30, stride >= 1 and 0 <= padding <= kernel/2, got kernel ({}, {}) "
             "stride ({}, {}) padding ({}, {})",
             p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w);
  int64_t h = x.size(-2), w = x.size(-1);
  int64_t ho = conv_out_size(h, p.kernel_h, p.stride_h, p.pad_h);
  int64_t wo = conv_out_size(w, p.kernel_w, p.stride_w, p.pad_w);
  WEFT_CHECK(h + 2 * p.pad_h >= p.kernel_h && w + 2 * p.pad_w >= p.kernel_w,
             "max_pool2d: input {} padded by ({}, {}) is smaller than the kernel ({}, {})", tensor_desc(x),
             p.pad_h, p.pad_w, p.kernel_h, p.kernel_w);
  Shape shape = x.shape();
  shape[shape.size() - 2] = ho;
  shape[shape.size() - 1] = wo;
  int64_t planes = x.numel() / std::max<int64_t>(h * w, 1);
  const KernelBackend& backend = kernel_backend(x.device(), "max_pool2d");
  Tensor out = empty(shape, like(x));
  Tensor indices = empty(shape, {.dtype = DType::i64, .device = x.device()});
  if (out.numel() > 0)
    backend.max_pool2d(x.contiguous().view({planes, h, w}), p, out.view({planes, ho, wo}),
                       indices.view({planes, ho, wo}));
  return {out, indices};
}

Tensor max_pool2d_backward(const Tensor& grad_, const Tensor& indices_, const Shape& input_shape) {
  Tensor grad = plain(grad_), indices = plain(indices_);
  const char* op = "max_pool2d_backward";
  check_float(op, grad, "grad");
  WEFT_CHECK(indices.defined() && indices.dtype() == DType::i64 && indices.shape() == grad.shape(),
             "{}: indices {} must be i64 and shaped like grad {}", op, tensor_desc(indices),
             tensor_desc(grad));
  check_device(op, grad, indices);
  size_t nd = input_shape.size();
  WEFT_CHECK((nd == 3 || nd == 4) && grad.dim() == int64_t(nd) &&
                 std::equal(input_shape.begin(), input_shape.end() - 2, grad.shape().begin()),
             "{}: grad {} does not fit input shape {}", op, tensor_desc(grad), shape_str(input_shape));
  int64_t h = input_shape[nd - 2], w = input_shape[nd - 1], ho = grad.size(-2), wo = grad.size(-1);
  int64_t planes = shape_numel(input_shape) / std::max<int64_t>(h * w, 1);
  const KernelBackend& backend = kernel_backend(grad.device(), op);
  Tensor dx = zeros(input_shape, like(grad));
  if (grad.numel() == 0) return dx;
  // The backend checks (or, where that costs a copy to the host, skips) out-of-plane indices.
  backend.max_pool2d_backward(grad.contiguous().view({planes, ho, wo}), indices.contiguous().view({planes, ho, wo}),
                              dx.view({planes, h, w}));
  return dx;
}

}  // namespace weft::kernels
