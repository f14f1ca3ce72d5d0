// kernels: entry points of embedding and the index ops (index_select, index_add, gather,
// scatter_add): checks, allocation and dispatch to the device's backend. Index values are bounds-checked by
// the backend, which is where they can be read.
#include <fmt/format.h>

#include "kernels/backend.h"
#include "kernels/nn.h"
#include "kernels/nn_checks.h"

namespace weft::kernels {
using namespace checks;

Tensor embedding(const Tensor& weight_, const Tensor& indices_) {
  Tensor weight = plain(weight_), indices = plain(indices_);
  check_index("embedding", indices, "indices");
  WEFT_CHECK(weight.defined() && weight.dim() == 2, "embedding: weight must be [V, D], got {}",
             tensor_desc(weight));
  check_device("embedding", weight, indices);
  Shape shape = indices.shape();
  shape.push_back(weight.size(1));
  const KernelBackend& backend = kernel_backend(weight.device(), "embedding");
  Tensor out = empty(shape, like(weight));
  Tensor idx = indices.contiguous();
  backend.check_index_range(idx, weight.size(0), "embedding", "embeddings");
  backend.embedding(weight.contiguous(), idx, out);
  return out;
}

Tensor embedding_backward(const Tensor& grad_, const Tensor& indices_, int64_t num_weights) {
  Tensor grad = plain(grad_), indices = plain(indices_);
  const char* op = "embedding_backward";
  check_float(op, grad, "grad");
  check_index(op, indices, "indices");
  check_device(op, grad, indices);
  WEFT_CHECK(grad.dim() == indices.dim() + 1 &&
                 Shape(grad.shape().begin(), grad.shape().end() - 1) == indices.shape(),
             "{}: grad {} must be indices' shape {} plus one embedding dim", op, tensor_desc(grad),
             shape_str(indices.shape()));
  WEFT_CHECK(num_weights >= 0, "{}: num_weights must be >= 0, got {}", op, num_weights);
  int64_t d = grad.size(-1);
  // 16-bit gradients accumulate in f32 so that repeated tokens do not lose precision.
  DType acc = is_16bit(grad.dtype()) ? DType::f32 : grad.dtype();
  const KernelBackend& backend = kernel_backend(grad.device(), op);
  Tensor out = zeros({num_weights, d}, {.dtype = acc, .device = grad.device()});
  Tensor idx = indices.contiguous();
  backend.check_index_range(idx, num_weights, op, "embeddings");
  backend.embedding_backward(grad.to(acc).contiguous(), idx, out);
  return out.to(grad.dtype());
}

Tensor index_select(const Tensor& x_, int64_t dim, const Tensor& index_) {
  Tensor x = plain(x_), index = plain(index_);
  check_index("index_select", index, "index");
  WEFT_CHECK(x.defined() && x.dim() >= 1, "index_select: input must have at least 1 dim, got {}",
             tensor_desc(x));
  WEFT_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got {}", tensor_desc(index));
  check_device("index_select", x, index);
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Shape shape = x.shape();
  shape[d] = index.numel();
  const KernelBackend& backend = kernel_backend(x.device(), "index_select");
  Tensor out = empty(shape, like(x));
  Tensor idx = index.contiguous();
  backend.check_index_range(idx, x.size(d), "index_select",
                            fmt::format("positions along dim {} of {}", d, tensor_desc(x)));
  if (out.numel() > 0) backend.index_select(x.contiguous(), d, idx, out);
  return out;
}

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index_, const Tensor& src_) {
  Tensor index = plain(index_), src = plain(src_);
  check_index("index_add", index, "index");
  WEFT_CHECK(src.defined() && !shape.empty() && src.dim() == int64_t(shape.size()),
             "index_add: src {} must have as many dims as the output shape {} (at least 1)", tensor_desc(src),
             shape_str(shape));
  WEFT_CHECK(index.dim() <= 1, "index_add: index must be 1-D, got {}", tensor_desc(index));
  check_device("index_add", src, index);
  int64_t d = wrap_dim(dim, int64_t(shape.size()), "index_add");
  Shape want = shape;
  want[d] = index.numel();
  WEFT_CHECK(src.shape() == want,
             "index_add: src {} must have shape {} (output {} with dim {} sized like index {})",
             tensor_desc(src), shape_str(want), shape_str(shape), d, tensor_desc(index));
  const KernelBackend& backend = kernel_backend(src.device(), "index_add");
  Tensor out = zeros(shape, like(src));
  Tensor idx = index.contiguous();
  backend.check_index_range(idx, shape[d], "index_add",
                            fmt::format("positions along dim {} of {}", d, shape_str(shape)));
  if (src.numel() > 0) backend.index_add(out, d, idx, src.contiguous());
  return out;
}

Tensor gather(const Tensor& x_, int64_t dim, const Tensor& index_) {
  Tensor x = plain(x_), index = plain(index_);
  check_index("gather", index, "index");
  WEFT_CHECK(x.defined() && index.dim() == x.dim(), "gather: index {} must have as many dims as input {}",
             tensor_desc(index), tensor_desc(x));
  check_device("gather", x, index);
  if (x.dim() == 0) return gather(x.view({1}), dim, index.view({1})).view({});
  int64_t d = wrap_dim(dim, x.dim(), "gather");
  for (int64_t k = 0; k < x.dim(); ++k)
    WEFT_CHECK(k == d || index.size(k) <= x.size(k), "gather: index {} is larger than input {} in dim {}",
               tensor_desc(index), tensor_desc(x), k);
  const KernelBackend& backend = kernel_backend(x.device(), "gather");
  Tensor out = empty(index.shape(), like(x));
  Tensor idx = index.contiguous();
  backend.check_index_range(idx, x.size(d), "gather",
                            fmt::format("positions along dim {} of {}", d, tensor_desc(x)));
  if (out.numel() > 0) backend.gather(x, d, idx, out);
  return out;
}

Tensor scatter_add(const Tensor& self_, int64_t dim, const Tensor& index_, const Tensor& src_) {
  Tensor self = plain(self_), index = plain(index_), src = plain(src_);
  check_index("scatter_add", index, "index");
  WEFT_CHECK(self.defined() && src.defined() && index.dim() == self.dim() && src.dim() == self.dim(),
             "scatter_add: self {}, index {} and src {} must have the same number of dims", tensor_desc(self),
             tensor_desc(index), tensor_desc(src));
  WEFT_CHECK(src.dtype() == self.dtype(), "scatter_add: src {} must have self's dtype ({})", tensor_desc(src),
             tensor_desc(self));
  check_device("scatter_add", self, index);
  check_device("scatter_add", self, src);
  if (self.dim() == 0) return scatter_add(self.view({1}), dim, index.view({1}), src.view({1})).view({});
  int64_t d = wrap_dim(dim, self.dim(), "scatter_add");
  for (int64_t k = 0; k < self.dim(); ++k)
    WEFT_CHECK(index.size(k) <= src.size(k) && (k == d || index.size(k) <= self.size(k)),
               "scatter_add: index {} is larger than src {} or self {} in dim {}", tensor_desc(index),
               tensor_desc(src), tensor_desc(self), k);
  const KernelBackend& backend = kernel_backend(self.device(), "scatter_add");
  Tensor out = self.clone();
  Tensor idx = index.contiguous();
  backend.check_index_range(idx, self.size(d), "scatter_add",
                            fmt::format("positions along dim {} of {}", d, tensor_desc(self)));
  if (idx.numel() > 0) backend.scatter_add(out, d, idx, src);
  return out;
}

}  // namespace weft::kernels
