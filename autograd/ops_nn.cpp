// autograd: neural-network functions (softmax family, layer norm, indexing, losses,
// concatenation, dropout, convolution, pooling) over the fused kernels in kernels/nn.h.
#include <array>

#include "autograd/autocast.h"
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/nn.h"
#include "kernels/reduce.h"

namespace weft {

using autograd::needs_grad;
using autograd::record;
using autograd::TensorList;
namespace k = kernels;

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor y = k::softmax(x, dim);
  if (needs_grad({&x})) {
    record("SoftmaxBackward", {x}, {y}, [y = y.detach(), dim](const TensorList& g) -> TensorList {
      return {k::softmax_backward(g[0], y, dim)};
    })->reads_outputs({y});
  }
  return y;
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor y = k::log_softmax(x, dim);
  if (needs_grad({&x})) {
    record("LogSoftmaxBackward", {x}, {y}, [y = y.detach(), dim](const TensorList& g) -> TensorList {
      return {k::log_softmax_backward(g[0], y, dim)};
    })->reads_outputs({y});
  }
  return y;
}

namespace {

// The number of trailing dims normalized_shape names, checked against x and the affine tensors.
int64_t norm_dims(const char* op, const Tensor& x, const Shape& normalized_shape,
                  std::initializer_list<const Tensor*> affine) {
  int64_t nd = int64_t(normalized_shape.size());
  bool ok = nd >= 1 && nd <= x.dim();
  for (int64_t i = 0; ok && i < nd; ++i) ok = x.size(x.dim() - nd + i) == normalized_shape[size_t(i)];
  WEFT_CHECK(ok, "{}: normalized_shape {} does not match the trailing dims of input {}", op,
             shape_str(normalized_shape), tensor_desc(x));
  for (const Tensor* p : affine) {
    WEFT_CHECK(!p->defined() || p->shape() == normalized_shape,
               "{}: weight/bias {} must have shape normalized_shape {}", op, tensor_desc(*p),
               shape_str(normalized_shape));
  }
  return nd;
}

Tensor detached(const Tensor& t) { return t.defined() ? t.detach() : Tensor(); }

// A norm's input and affine parameters cast to one dtype, promoted as element-wise operands are (under autocast a
// 16-bit activation meets f32 weights: Qwen3's head norms after the bf16 q and k projections); differentiable casts.
template <size_t N>
std::array<Tensor, N> in_one_dtype(std::array<Tensor, N> ts) {
  DType d = ts[0].dtype();
  for (const Tensor& t : ts) d = t.defined() && is_floating(t.dtype()) && is_floating(d) ? promote_types(d, t.dtype()) : d;
  for (Tensor& t : ts) t = t.defined() ? t.to(d) : t;
  return ts;
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, const Tensor& bias_in,
                  double eps) {
  const auto [x, weight, bias] = in_one_dtype<3>({x_in, weight_in, bias_in});
  int64_t nd = norm_dims("layer_norm", x, normalized_shape, {&weight, &bias});
  auto [y, mu, rstd] = k::layer_norm(x, nd, detached(weight), detached(bias), eps);
  if (needs_grad({&x, &weight, &bias})) {
    TensorList inputs{x, weight, bias};
    record("LayerNormBackward", inputs, {y},
           [x = x.detach(), mu = mu, rstd = rstd, w = detached(weight), b = detached(bias),
            nd](const TensorList& g) -> TensorList {
             auto [dx, dw, db] = k::layer_norm_backward(g[0], x, mu, rstd, w, b, nd);
             return {dx, dw, db};
           });
  }
  return y;
}

Tensor rms_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight_in, double eps) {
  const auto [x, weight] = in_one_dtype<2>({x_in, weight_in});
  int64_t nd = norm_dims("rms_norm", x, normalized_shape, {&weight});
  auto [y, rstd] = k::rms_norm(x, nd, detached(weight), eps);
  if (needs_grad({&x, &weight})) {
    record("RmsNormBackward", {x, weight}, {y},
           [x = x.detach(), rstd = rstd, w = detached(weight), nd](const TensorList& g) -> TensorList {
             auto [dx, dw] = k::rms_norm_backward(g[0], x, rstd, w, nd);
             return {dx, dw};
           });
  }
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  Tensor out = k::embedding(weight.detach(), indices);
  if (needs_grad({&weight})) {
    record("EmbeddingBackward", {weight}, {out},
           [idx = indices.detach(), v = weight.size(0)](const TensorList& g) -> TensorList {
             return {k::embedding_backward(g[0], idx, v)};
           });
  }
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = k::index_select(x.detach(), dim, index);
  if (needs_grad({&x})) {
    record("IndexSelectBackward", {x}, {out},
           [shape = x.shape(), dim, idx = index.detach()](const TensorList& g) -> TensorList {
             return {k::index_add(shape, dim, idx, g[0])};
           });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = k::gather(x.detach(), dim, index);
  if (needs_grad({&x})) {
    record("GatherBackward", {x}, {out},
           [shape = x.shape(), dim, idx = index.detach()](const TensorList& g) -> TensorList {
             return {k::scatter_add(zeros(shape, {.dtype = g[0].dtype(), .device = g[0].device()}), dim, idx, g[0])};
           });
  }
  return out;
}

Tensor scatter_add(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = k::scatter_add(self.detach(), dim, index, src.detach());
  if (needs_grad({&self, &src})) {
    record("ScatterAddBackward", {self, src}, {out},
           [dim, idx = index.detach(), rs = src.requires_grad()](const TensorList& g) -> TensorList {
             return {g[0], rs ? k::gather(g[0], dim, idx) : Tensor()};
           });
  }
  return out;
}

static k::Reduction parse_reduction(std::string_view r, const char* op) {
  if (r == "mean") return k::Reduction::mean;
  if (r == "sum") return k::Reduction::sum;
  if (r == "none") return k::Reduction::none;
  WEFT_ERROR("{}: reduction must be \"mean\", \"sum\" or \"none\", got \"{}\"", op, r);
}

// 16-bit logits are computed in f32 where they are read (no widened copy), and their gradient
// written in their dtype; the backward keeps the logits and two numbers a row, not log-probs. The loss is f32 then:
// under autocast it stays f32 (autocast computes it in f32); otherwise it is rounded to the logits' dtype, as torch's.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opts) {
  k::Reduction red = parse_reduction(opts.reduction, "cross_entropy");
  auto [loss, row_stats] = k::cross_entropy(logits.detach(), target, opts.ignore_index, opts.label_smoothing, red);
  if (needs_grad({&logits})) {
    record("CrossEntropyBackward", {logits}, {loss},
           [x = logits.detach(), row_stats = row_stats, t = target.detach(), opts, red](const TensorList& g) -> TensorList {
             return {k::cross_entropy_backward(g[0], x, row_stats, t, opts.ignore_index, opts.label_smoothing, red)};
           });
  }
  return autocast_dtype() || loss.dtype() == logits.dtype() ? loss : loss.to(logits.dtype());
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  WEFT_CHECK(!xs.empty() && std::all_of(xs.begin(), xs.end(), [](const Tensor& t) { return t.defined(); }),
             "cat: expects at least one tensor, none undefined ({} given)", xs.size());
  TensorList detached;
  for (const Tensor& t : xs) detached.push_back(t.detach());
  Tensor out = k::cat(detached, dim);
  if (needs_grad(xs)) {
    int64_t d = wrap_dim(dim, xs[0].dim(), "cat");
    Shape sizes;
    for (const Tensor& t : xs) sizes.push_back(t.size(d));
    record("CatBackward", xs, {out}, [sizes, d](const TensorList& g) -> TensorList {
      auto parts = g[0].split_with_sizes(sizes, d);
      return TensorList(parts.begin(), parts.end());
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& xs, int64_t dim) {
  WEFT_CHECK(!xs.empty(), "stack: expects at least one tensor");
  for (const Tensor& t : xs)
    WEFT_CHECK(t.shape() == xs[0].shape(), "stack: all tensors must have the same shape, got {} and {}",
               tensor_desc(xs[0]), tensor_desc(t));
  int64_t d = wrap_dim(dim, xs[0].dim() + 1, "stack");
  TensorList parts;
  for (const Tensor& t : xs) parts.push_back(t.unsqueeze(d));
  return cat(parts, d);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen, const kernels::RandomBlock& block) {
  WEFT_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got {}", p);
  if (!training || p == 0) return x;
  auto [y, mask] = k::dropout(x.detach(), p, gen, block);
  if (needs_grad({&x})) {
    record("DropoutBackward", {x}, {y}, [mask = mask, p](const TensorList& g) -> TensorList {
      return {k::dropout_backward(g[0], mask, p)};
    });
  }
  return y;
}

Tensor conv2d(const Tensor& x_, const Tensor& weight_, const Tensor& bias_, int64_t stride, int64_t padding) {
  const Tensor x = autocast_input(x_), weight = autocast_input(weight_), bias = autocast_input(bias_);
  WEFT_CHECK(stride >= 1 && padding >= 0, "conv2d: stride must be >= 1 and padding >= 0, got {} and {}",
             stride, padding);
  k::Conv2dParams p{stride, stride, padding, padding};
  Tensor y = k::conv2d(x.detach(), weight.detach(), bias.defined() ? bias.detach() : Tensor(), p);
  if (needs_grad({&x, &weight, &bias})) {
    TensorList inputs{x, weight};
    if (bias.defined()) inputs.push_back(bias);
    record("Conv2dBackward", inputs, {y},
           [x = x.detach(), w = weight.detach(), has_bias = bias.defined(), p](const TensorList& g) -> TensorList {
             auto [dx, dw, db] = k::conv2d_backward(g[0], x, w, has_bias, p);
             TensorList r{dx, dw};
             if (has_bias) r.push_back(db);
             return r;
           });
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel_size, int64_t stride, int64_t padding) {
  if (stride == -1) stride = kernel_size;  // the default: windows side by side
  WEFT_CHECK(kernel_size >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel_size,
             "max_pool2d: need kernel_size >= 1, stride >= 1 and 0 <= padding <= kernel_size/2, got "
             "kernel {} stride {} padding {}", kernel_size, stride, padding);
  k::Pool2dParams p{kernel_size, kernel_size, stride, stride, padding, padding};
  auto [y, idx] = k::max_pool2d(x.detach(), p);
  if (needs_grad({&x})) {
    record("MaxPool2dBackward", {x}, {y}, [idx = idx, shape = x.shape()](const TensorList& g) -> TensorList {
      return {k::max_pool2d_backward(g[0], idx, shape)};
    });
  }
  return y;
}

}  // namespace weft
