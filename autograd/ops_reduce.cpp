// autograd: reductions and their gradients (broadcast back over the reduced dims).
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/nn.h"
#include "kernels/reduce.h"

namespace weft {

using autograd::needs_grad;
using autograd::record;
using autograd::TensorList;
namespace k = kernels;

namespace {

// Reshapes a reduced gradient so it broadcasts against the input (re-inserting size-1 dims
// when keepdim was false) and expands it, without copying.
Tensor expand_back(const Tensor& g, const Shape& input_shape, const Shape& dims, bool keepdim) {
  Tensor r = g;
  if (!keepdim) r = r.reshape(k::reduced_shape(input_shape, dims, true));
  return r.expand(input_shape);
}

int64_t reduced_count(const Shape& shape, const Shape& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[size_t(d)];
  return n;
}

}  // namespace

Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  Tensor out = k::reduce(k::ReduceOp::sum, x, dims, keepdim);
  if (needs_grad({&x})) {
    Shape nd = k::normalize_dims(dims, x.dim(), "sum");
    record("SumBackward", {x}, {out}, [shape = x.shape(), nd, keepdim](const TensorList& g) -> TensorList {
      return {expand_back(g[0], shape, nd, keepdim)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  Tensor out = k::reduce(k::ReduceOp::mean, x, dims, keepdim);
  if (needs_grad({&x})) {
    Shape nd = k::normalize_dims(dims, x.dim(), "mean");
    double inv = 1.0 / double(std::max<int64_t>(reduced_count(x.shape(), nd), 1));
    record("MeanBackward", {x}, {out}, [shape = x.shape(), nd, keepdim, inv](const TensorList& g) -> TensorList {
      return {expand_back(k::binary_scalar(k::BinaryOp::mul, g[0], inv), shape, nd, keepdim)};
    });
  }
  return out;
}

namespace {
// max()/min() over all elements: the gradient is shared evenly by all elements equal to the
// result (torch's evenly-distributed rule).
Tensor extreme_all(k::ReduceOp op, const char* name, const Tensor& x) {
  Tensor out = k::reduce(op, x, {}, false);
  if (needs_grad({&x})) {
    record(name, {x}, {out}, [x = x.detach(), out = out.detach()](const TensorList& g) -> TensorList {
      Tensor hit = k::binary(k::BinaryOp::logical_or, k::binary(k::BinaryOp::eq, x, out),  // or, for a NaN result, the
                             k::binary(k::BinaryOp::logical_and, k::binary(k::BinaryOp::ne, x, x),  // NaNs (as PyTorch)
                                       k::binary(k::BinaryOp::ne, out, out)));
      Tensor count = k::reduce(k::ReduceOp::sum, hit, {}, false);
      Tensor share = k::binary(k::BinaryOp::div, g[0], count.to(g[0].dtype()));
      return {k::where(hit, share.expand(x.shape()), scalar_tensor(0.0, {.dtype = g[0].dtype(), .device = g[0].device()}))};
    })->reads_outputs({out});
  }
  return out;
}

std::pair<Tensor, Tensor> extreme_dim(bool is_max, const char* name, const Tensor& x, int64_t dim, bool keepdim) {
  auto [values, indices] = is_max ? k::max_dim(x, dim, keepdim) : k::min_dim(x, dim, keepdim);
  if (needs_grad({&x})) {
    int64_t d = wrap_dim(dim, x.dim(), name);
    record(name, {x}, {values}, [shape = x.shape(), idx = indices, d, keepdim](const TensorList& g) -> TensorList {
      Tensor gi = keepdim || shape.empty() ? g[0] : g[0].unsqueeze(d);  // a 0-d x: its index and gradient as they are
      Tensor ii = keepdim || shape.empty() ? idx : idx.unsqueeze(d);
      return {k::scatter_add(zeros(shape, {.dtype = g[0].dtype(), .device = g[0].device()}), d, ii, gi)};
    });
  }
  return {values, indices};
}
}  // namespace

Tensor max(const Tensor& x) { return extreme_all(k::ReduceOp::max, "MaxBackward", x); }
Tensor min(const Tensor& x) { return extreme_all(k::ReduceOp::min, "MinBackward", x); }
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim(true, "MaxBackward", x, dim, keepdim);
}
std::pair<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim) {
  return extreme_dim(false, "MinBackward", x, dim, keepdim);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return k::argmax(x, dim, keepdim); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return k::argmin(x, dim, keepdim); }

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  Tensor out = k::var(x, dims, correction, keepdim);
  if (needs_grad({&x})) {
    Shape nd = k::normalize_dims(dims, x.dim(), "var");
    double n = double(reduced_count(x.shape(), nd));
    record("VarBackward", {x}, {out}, [x = x.detach(), nd, keepdim, n, correction](const TensorList& g) -> TensorList {
      // d var / dx = 2 (x - mean) / (n - correction), the denominator at least 0 as the forward's
      Tensor centered = k::binary(k::BinaryOp::sub, x, k::reduce(k::ReduceOp::mean, x, nd, true));
      Tensor gk = keepdim ? g[0] : g[0].reshape(k::reduced_shape(x.shape(), nd, true));
      Tensor scaled = k::binary_scalar(k::BinaryOp::mul, gk, 2.0 / std::max(0.0, n - double(correction)));
      return {k::binary(k::BinaryOp::mul, centered, scaled)};
    });
  }
  return out;
}

}  // namespace weft
