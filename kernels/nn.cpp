// kernels: entry points of the neural-network kernels (kernels/nn.h). Each checks its arguments (naming the op, shapes,
// dtypes and devices), allocates the outputs, makes the inputs contiguous where the loops need it and dispatches
// through the device's backend (kernels/backend.h); 16-bit types that the loops do not take go through f32 here.
#include "kernels/nn.h"

#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "kernels/nn_checks.h"

namespace weft::kernels {
using namespace checks;
namespace {

// [outer, n, inner] around dim (a 0-dim tensor is one element).
void split_dim(const Tensor& x, int64_t dim, int64_t& outer, int64_t& n, int64_t& inner) {
  outer = n = inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < dim) outer *= x.size(d);
    else if (d == dim) n = x.size(d);
    else inner *= x.size(d);
  }
}

Tensor softmax_forward(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_float(op, x, "input");
  int64_t d = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), op), outer, n, inner;
  split_dim(x, d, outer, n, inner);
  const KernelBackend& backend = kernel_backend(x.device(), op);
  Tensor y = empty(x.shape(), like(x));
  backend.softmax(x.contiguous(), y, outer, n, inner, log);
  return y;
}

Tensor softmax_backward_impl(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_float(op, y, "output");
  check_float(op, grad, "grad");
  check_same(op, grad, y);
  int64_t d = wrap_dim(dim, std::max<int64_t>(y.dim(), 1), op), outer, n, inner;
  split_dim(y, d, outer, n, inner);
  const KernelBackend& backend = kernel_backend(y.device(), op);
  Tensor dx = empty(y.shape(), like(y));
  backend.softmax_backward(grad.contiguous(), y.contiguous(), dx, outer, n, inner, log);
  return dx;
}

Shape stats_shape(const Tensor& x, int64_t normalized_ndim) {
  return Shape(x.shape().begin(), x.shape().end() - normalized_ndim);
}

void check_affine(const char* op, const Tensor& p, const char* name, const Tensor& x, const Shape& norm) {
  if (!p.defined()) return;
  check_device(op, p, x);
  WEFT_CHECK(p.dtype() == x.dtype() && p.shape() == norm,
             "{}: {} {} must have dtype {} and the normalized shape {} of input {}", op, name, tensor_desc(p),
             dtype_name(x.dtype()), shape_str(norm), tensor_desc(x));
}

Shape norm_shape(const char* op, const Tensor& x, int64_t normalized_ndim) {
  WEFT_CHECK(normalized_ndim >= 1 && normalized_ndim <= x.dim(),
             "{}: normalized_ndim {} must be in [1, {}] for input {}", op, normalized_ndim, x.dim(),
             tensor_desc(x));
  return Shape(x.shape().end() - normalized_ndim, x.shape().end());
}

}  // namespace

// ---------------------------------------------------------------- softmax family

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_forward(plain(x), dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_forward(plain(x), dim, true); }
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl(plain(grad), plain(y), dim, false);
}
Tensor log_softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim) {
  return softmax_backward_impl(plain(grad), plain(y), dim, true);
}

// ---------------------------------------------------------------- layer norm

namespace {

// Layer norm, or RMS norm when !center (no mean subtracted, no bias, no mean returned).
std::tuple<Tensor, Tensor, Tensor> norm_forward(const char* op, bool center, const Tensor& x_,
                                                int64_t normalized_ndim, const Tensor& weight_,
                                                const Tensor& bias_, double eps) {
  Tensor x = plain(x_), weight = plain(weight_), bias = plain(bias_);
  check_float(op, x, "input");
  Shape norm = norm_shape(op, x, normalized_ndim);
  check_affine(op, weight, "weight", x, norm);
  check_affine(op, bias, "bias", x, norm);
  WEFT_CHECK(eps >= 0, "{}: eps must be >= 0, got {}", op, eps);
  const KernelBackend& backend = kernel_backend(x.device(), op);
  TensorOptions stats{.dtype = stats_dtype(x.dtype()), .device = x.device()};
  Tensor y = empty(x.shape(), like(x));
  Tensor rstd = empty(stats_shape(x, normalized_ndim), stats), mean = center ? empty(rstd.shape(), stats) : Tensor();
  backend.layer_norm(x.contiguous(), contig(weight), contig(bias), eps, y, mean, rstd);
  return {y, mean, rstd};
}

std::tuple<Tensor, Tensor, Tensor> norm_backward(const char* op, bool center, const Tensor& grad_,
                                                 const Tensor& x_, const Tensor& mean_, const Tensor& rstd_,
                                                 const Tensor& weight_, const Tensor& bias_,
                                                 int64_t normalized_ndim) {
  Tensor grad = plain(grad_), x = plain(x_), mean = plain(mean_), rstd = plain(rstd_);
  Tensor weight = plain(weight_), bias = plain(bias_);
  check_float(op, x, "input");
  check_float(op, grad, "grad");
  check_same(op, grad, x);
  Shape norm = norm_shape(op, x, normalized_ndim);
  check_affine(op, weight, "weight", x, norm);
  check_affine(op, bias, "bias", x, norm);
  DType stats = stats_dtype(x.dtype());
  for (const Tensor* s : {&mean, &rstd}) {
    if (s == &mean && !center) continue;
    WEFT_CHECK(
        s->defined() && s->dtype() == stats && s->numel() == shape_numel(stats_shape(x, normalized_ndim)),
        "{}: saved statistics {} do not fit input {} (want {}{})", op, tensor_desc(*s), tensor_desc(x),
        dtype_name(stats), shape_str(stats_shape(x, normalized_ndim)));
    check_device(op, *s, x);
  }
  const KernelBackend& backend = kernel_backend(x.device(), op);
  Tensor dx = empty(x.shape(), like(x));
  // No rows (an empty batch) leave them unwritten by the kernels: zeros then.
  auto grad_of = [&](const Tensor& t) { return t.defined() ? (x.numel() ? empty : zeros)(t.shape(), like(t)) : Tensor(); };
  Tensor dweight = grad_of(weight), dbias = grad_of(bias);
  backend.layer_norm_backward(grad.contiguous(), x.contiguous(), center ? mean.contiguous() : Tensor(),
                              rstd.contiguous(), contig(weight), dx, dweight, dbias);
  return {dx, dweight, dbias};
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> layer_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& weight,
                                              const Tensor& bias, double eps) {
  return norm_forward("layer_norm", true, x, normalized_ndim, weight, bias, eps);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& mean,
                                                       const Tensor& rstd, const Tensor& weight,
                                                       const Tensor& bias, int64_t normalized_ndim) {
  return norm_backward("layer_norm_backward", true, grad, x, mean, rstd, weight, bias, normalized_ndim);
}

std::pair<Tensor, Tensor> rms_norm(const Tensor& x, int64_t normalized_ndim, const Tensor& weight, double eps) {
  auto [y, mean, rstd] = norm_forward("rms_norm", false, x, normalized_ndim, weight, Tensor(), eps);
  return {y, rstd};
}

std::pair<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& x, const Tensor& rstd,
                                            const Tensor& weight, int64_t normalized_ndim) {
  auto [dx, dweight, dbias] =
      norm_backward("rms_norm_backward", false, grad, x, Tensor(), rstd, weight, Tensor(), normalized_ndim);
  return {dx, dweight};
}

// ---------------------------------------------------------------- cross-entropy

std::pair<Tensor, Tensor> cross_entropy(const Tensor& logits_, const Tensor& target_, int64_t ignore_index,
                                        double label_smoothing, Reduction reduction) {
  Tensor logits = plain(logits_), target = plain(target_);
  const char* op = "cross_entropy";
  check_float(op, logits, "logits");
  check_index(op, target, "target");
  check_device(op, logits, target);
  WEFT_CHECK(logits.dim() == 1 || logits.dim() == 2, "cross_entropy: logits must be [N, C] or [C], got {}",
             tensor_desc(logits));
  int64_t n = logits.dim() == 2 ? logits.size(0) : 1, c = logits.size(-1);
  bool target_ok = logits.dim() == 2 ? (target.dim() == 1 && target.size(0) == n)
                                     : (target.dim() <= 1 && target.numel() == 1);
  WEFT_CHECK(target_ok,
             "cross_entropy: target {} does not fit logits {} (want [N] for [N, C], a scalar for [C])",
             tensor_desc(target), tensor_desc(logits));
  WEFT_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
             "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing);
  WEFT_CHECK(c > 0, "cross_entropy: logits {} have no classes", tensor_desc(logits));
  const KernelBackend& backend = kernel_backend(logits.device(), op);
  const TensorOptions stats{.dtype = stats_dtype(logits.dtype()), .device = logits.device()};
  Tensor row_stats = empty({n, 2}, stats);
  Tensor loss = empty(reduction == Reduction::none ? Shape{n} : Shape{}, stats);
  backend.cross_entropy(logits.reshape({n, c}).contiguous(), target.reshape({n}).contiguous(), ignore_index,
                        label_smoothing, reduction, loss, row_stats);
  if (logits.dim() == 1 && reduction == Reduction::none) loss = loss.view({});
  return {loss, row_stats};
}

Tensor cross_entropy_backward(const Tensor& grad_loss_, const Tensor& logits_, const Tensor& row_stats_,
                              const Tensor& target_, int64_t ignore_index, double label_smoothing,
                              Reduction reduction) {
  Tensor grad_loss = plain(grad_loss_), logits = plain(logits_), row_stats = plain(row_stats_),
         target = plain(target_);
  const char* op = "cross_entropy_backward";
  check_float(op, logits, "logits");
  check_float(op, grad_loss, "grad");
  check_index(op, target, "target");
  check_device(op, logits, target);
  check_device(op, logits, grad_loss);
  check_device(op, logits, row_stats);
  WEFT_CHECK(logits.dim() == 1 || logits.dim() == 2, "{}: logits must be [N, C] or [C], got {}", op,
             tensor_desc(logits));
  int64_t n = logits.dim() == 2 ? logits.size(0) : 1, c = logits.size(-1);
  WEFT_CHECK(target.numel() == n, "{}: target {} does not fit logits {}", op, tensor_desc(target),
             tensor_desc(logits));
  const DType stats = stats_dtype(logits.dtype());
  WEFT_CHECK(row_stats.dtype() == stats && row_stats.dim() == 2 && row_stats.size(0) == n && row_stats.size(1) == 2,
             "{}: row_stats {} do not fit logits {} (want [{}, 2] {})", op, tensor_desc(row_stats),
             tensor_desc(logits), n, dtype_name(stats));
  WEFT_CHECK(grad_loss.dtype() == stats && grad_loss.numel() == (reduction == Reduction::none ? n : 1),
             "{}: grad {} does not fit the loss of logits {}", op, tensor_desc(grad_loss), tensor_desc(logits));
  const KernelBackend& backend = kernel_backend(logits.device(), op);
  Tensor dlogits = empty(logits.shape(), {.dtype = logits.dtype(), .device = logits.device()});
  backend.cross_entropy_backward(grad_loss.reshape({grad_loss.numel()}).contiguous(),
                                 logits.reshape({n, c}).contiguous(), row_stats.contiguous(),
                                 target.reshape({n}).contiguous(), ignore_index, label_smoothing, reduction,
                                 dlogits.view({n, c}));
  return dlogits;
}

// ---------------------------------------------------------------- cat

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  WEFT_CHECK(!xs.empty(), "cat: expects a non-empty list of tensors");
  // 1-D empty tensors are skipped whatever their neighbours' shapes, as in PyTorch.
  auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.numel() == 0; };
  const Tensor* ref = nullptr;
  DType dtype = DType::bool_;
  for (size_t i = 0; i < xs.size(); ++i) {
    WEFT_CHECK(xs[i].defined(), "cat: tensor {} is undefined", i);
    check_device("cat", xs[0], xs[i]);
    dtype = i == 0 ? xs[i].dtype() : promote_types(dtype, xs[i].dtype());
    if (!ref && !skipped(xs[i])) ref = &xs[i];
  }
  if (!ref) return empty({0}, {.dtype = dtype, .device = xs[0].device()});
  WEFT_CHECK(ref->dim() > 0, "cat: zero-dimensional tensor {} cannot be concatenated", tensor_desc(*ref));
  int64_t d = wrap_dim(dim, ref->dim(), "cat");
  Shape shape = ref->shape();
  shape[d] = 0;
  std::vector<Tensor> parts;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    if (skipped(x)) continue;
    WEFT_CHECK(x.dim() == ref->dim(), "cat: tensor {} {} has {} dims but tensor {} has {}", i, tensor_desc(x),
               x.dim(), ref - xs.data(), ref->dim());
    for (int64_t k = 0; k < x.dim(); ++k)
      WEFT_CHECK(k == d || x.size(k) == ref->size(k),
                 "cat: tensor {} {} differs from tensor {} {} in dim {} (sizes must match except in dim {})",
                 i, tensor_desc(x), ref - xs.data(), tensor_desc(*ref), k, d);
    shape[d] += x.size(d);
    parts.push_back(x.detach());
  }
  const KernelBackend& backend = kernel_backend(ref->device(), "cat");
  Tensor out = empty(shape, {.dtype = dtype, .device = ref->device()});
  if (out.numel() == 0) return out;
  backend.cat(parts, d, out);
  return out;
}

// ---------------------------------------------------------------- dropout

std::pair<Tensor, Tensor> dropout(const Tensor& x_, double p, Generator* gen, const RandomBlock& b) {
  Tensor x = plain(x_);
  check_float("dropout", x, "input");
  WEFT_CHECK(p >= 0 && p <= 1, "dropout: probability p must be in [0, 1], got {}", p);
  WEFT_CHECK(b.parts >= 1 && b.index >= 0 && b.index < b.parts, "dropout: block {} of {} parts: needs parts >= 1 and "
             "0 <= block < parts", b.index, b.parts);
  DropoutIndex at{x.numel(), 1, x.numel(), 0};  // x is the whole
  if (b.parts > 1) {
    int64_t outer;
    split_dim(x, wrap_dim(b.dim, x.dim(), "dropout (the block's dim)"), outer, at.rows, at.inner);
    at.extent = at.rows * b.parts, at.start = at.rows * b.index;
  }
  const KernelBackend& backend = kernel_backend(x.device(), "dropout");
  uint64_t seed = (gen ? *gen : default_generator()).next_u64();
  Tensor y = empty(x.shape(), like(x));
  Tensor mask = empty(x.shape(), {.dtype = DType::bool_, .device = x.device()});
  backend.dropout(x.contiguous(), p, seed, at, y, mask);
  return {y, mask};
}

Tensor dropout_backward(const Tensor& grad_, const Tensor& mask_, double p) {
  Tensor grad = plain(grad_), mask = plain(mask_);
  check_float("dropout_backward", grad, "grad");
  WEFT_CHECK(mask.defined() && (mask.dtype() == DType::bool_ || mask.dtype() == DType::u8) &&
                 mask.shape() == grad.shape(),
             "dropout_backward: mask {} must be a bool tensor shaped like grad {}", tensor_desc(mask),
             tensor_desc(grad));
  check_device("dropout_backward", grad, mask);
  WEFT_CHECK(p >= 0 && p <= 1, "dropout_backward: probability p must be in [0, 1], got {}", p);
  const KernelBackend& backend = kernel_backend(grad.device(), "dropout_backward");
  Tensor dx = empty(grad.shape(), like(grad));
  backend.dropout_backward(grad.contiguous(), mask.to(DType::bool_).contiguous(), p, dx);
  return dx;
}

}  // namespace weft::kernels
