// kernels: reduction entry points. They check arguments, pick the result dtype, and lay the input out as [outer,
// reduced, inner, inner_reduced] over contiguous memory for the backend: directly when the tensor's memory already has
// that form (a contiguous tensor reduced over one block of adjacent dims, or two blocks such as (0, 2, 3) of [N, C, H,
// W]; transposed/permuted views whose memory order allows it), else through one contiguous copy with the reduced dims
// moved last.
#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/backend.h"
#include "kernels/elementwise.h"

namespace weft::kernels {
namespace {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::prod: return "prod";
    case ReduceOp::sum_squares: return "sum_squares";
  }
  return "reduce(?)";
}

int64_t reduced_numel_of(const Tensor& x, const Shape& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= x.size(d);
  return n;
}

struct Layout {
  Tensor x;  // memory contiguous from x.data_ptr(), read as [outer, reduced, inner, inner_reduced]
  int64_t outer = 1, reduced = 1, inner = 1, inner_reduced = 1;
};

Layout plan_layout(const Tensor& x, const Shape& dims) {
  struct Dim { int64_t size, stride, pos; bool reduced; };
  std::vector<bool> is_reduced(size_t(x.dim()), false);
  for (int64_t d : dims) is_reduced[size_t(d)] = true;
  std::vector<Dim> ds;  // dims of size > 1, largest stride first (memory order)
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.size(d) != 1) ds.push_back({x.size(d), x.stride(d), d, is_reduced[size_t(d)]});
  std::stable_sort(ds.begin(), ds.end(), [](const Dim& a, const Dim& b) { return a.stride > b.stride; });

  // Usable as is when memory is dense in that order, the dims run kept / reduced / kept / reduced (any block may be
  // empty), and the kept dims are in their logical order (so the output is written contiguously).
  bool ok = true;
  int64_t expect = 1;
  for (size_t i = ds.size(); i-- > 0;) {
    ok &= ds[i].stride == expect;
    expect *= ds[i].size;
  }
  Layout l;
  int block = 0;  // 0: outer (kept), 1: reduced, 2: inner (kept), 3: inner_reduced
  int64_t last_kept = -1;
  for (const Dim& d : ds) {
    if (d.reduced != (block % 2 == 1)) ++block;
    if (block > 3) ok = false;
    if (!d.reduced) {
      ok &= d.pos > last_kept;
      last_kept = d.pos;
    }
    int64_t* sizes[4] = {&l.outer, &l.reduced, &l.inner, &l.inner_reduced};
    *sizes[std::min(block, 3)] *= d.size;
  }
  if (ok) {
    l.x = x.detach();
    return l;
  }
  Shape perm;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (!is_reduced[size_t(d)]) perm.push_back(d);
  for (int64_t d : dims) perm.push_back(d);
  l.x = x.detach().permute(perm).contiguous();
  l.outer = shape_numel(x.shape()) / reduced_numel_of(x, dims);
  l.reduced = reduced_numel_of(x, dims);
  l.inner = l.inner_reduced = 1;
  return l;
}


std::pair<Tensor, Tensor> arg_reduce(bool is_max, const Tensor& x, int64_t dim, bool keepdim) {
  const char* name = is_max ? "max_dim" : "min_dim";
  WEFT_CHECK(x.defined(), "{}: input is an undefined tensor", name);
  Shape dims = normalize_dims({dim}, x.dim(), name);
  WEFT_CHECK(reduced_numel_of(x, dims) > 0, "{}: dim {} of {} is empty; the {} is undefined", name, dim,
             tensor_desc(x), is_max ? "max" : "min");
  const KernelBackend& backend = kernel_backend(x.device(), name);
  Shape shape = reduced_shape(x.shape(), dims, keepdim);
  Tensor values = empty(shape, {.dtype = x.dtype(), .device = x.device()});
  Tensor indices = empty(shape, {.dtype = DType::i64, .device = x.device()});
  if (values.numel() == 0) return {values, indices};
  Layout l = plan_layout(x, dims);
  backend.arg_reduce(is_max, values, indices, l.x, l.outer, l.reduced, l.inner);
  return {values, indices};
}

}  // namespace

Shape normalize_dims(const Shape& dims, int64_t ndim, const char* op) {
  Shape out;
  if (ndim == 0) {  // a 0-dim tensor has nothing to reduce over; dim 0 / -1 are still accepted
    for (int64_t d : dims) wrap_dim(d, 0, op);
    return out;
  }
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    WEFT_CHECK(out[i] != out[i - 1], "{}: dim {} appears more than once in dims {}", op, out[i], shape_str(dims));
  return out;
}

Shape reduced_shape(const Shape& shape, const Shape& dims_normalized, bool keepdim) {
  Shape out;
  size_t j = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    bool reduced = j < dims_normalized.size() && dims_normalized[j] == int64_t(d);
    if (reduced) ++j;
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Tensor reduce(ReduceOp op, const Tensor& x, const Shape& dims, bool keepdim) {
  const char* name = reduce_op_name(op);
  WEFT_CHECK(x.defined(), "{}: input is an undefined tensor", name);
  Shape nd = normalize_dims(dims, x.dim(), name);
  DType dt = x.dtype();
  if (op == ReduceOp::sum_squares) {
    WEFT_CHECK(is_floating(dt), "sum_squares: {} is not a floating-point tensor", tensor_desc(x));
    dt = DType::f64;
  } else if (!is_floating(dt)) {  // as torch.mean: no output dtype to infer from an integer or bool input
    WEFT_CHECK(op != ReduceOp::mean, "mean: {} is not a floating tensor (f32, f64, bf16, f16); convert it first "
               "(x.to(kFloat32))", tensor_desc(x));
    if (op == ReduceOp::sum || op == ReduceOp::prod) dt = DType::i64;
  }
  int64_t n = reduced_numel_of(x, nd);
  Shape shape = reduced_shape(x.shape(), nd, keepdim);
  WEFT_CHECK(n > 0 || shape_numel(shape) == 0 || (op != ReduceOp::max && op != ReduceOp::min),
             "{}: reducing {} over dims {} covers no elements; the {} is undefined", name, tensor_desc(x),
             shape_str(nd), name);
  const KernelBackend& backend = kernel_backend(x.device(), name);
  Tensor out = empty(shape, {.dtype = dt, .device = x.device()});
  if (out.numel() == 0) return out;
  if (n == 0) {  // the identity: sum 0, prod 1, mean NaN (0/0)
    out.fill_(op == ReduceOp::prod ? 1.0 : op == ReduceOp::mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return out;
  }
  Layout l = plan_layout(x, nd);
  backend.reduce(op, out, l.x, l.outer, l.reduced, l.inner, l.inner_reduced);
  return out;
}

std::pair<Tensor, Tensor> max_dim(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(true, x, dim, keepdim); }
std::pair<Tensor, Tensor> min_dim(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(false, x, dim, keepdim); }
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(true, x, dim, keepdim).second; }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce(false, x, dim, keepdim).second; }

// Two passes (mean, then squared deviations d) for accuracy, corrected for the first mean's rounding: sum(d^2) -
// sum(d)^2 / n (Chan, Golub and LeVeque; rows of equal values had an f32 mean an ulp off, so a variance, not 0).
// 16-bit inputs work in f32.
Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  WEFT_CHECK(x.defined(), "var: input is an undefined tensor");
  WEFT_CHECK(is_floating(x.dtype()), "var: needs a floating tensor (f32, f64, bf16, f16), got {}", tensor_desc(x));
  WEFT_CHECK(correction >= 0, "var: correction must be >= 0, got {}", correction);
  Shape nd = normalize_dims(dims, x.dim(), "var");
  bool half = is_16bit(x.dtype());
  Tensor xc = half ? x.detach().to(DType::f32) : x.detach();
  Tensor mean = reduce(ReduceOp::mean, xc, nd, true);
  Tensor d = binary(BinaryOp::sub, xc, mean);
  Tensor d_sum = reduce(ReduceOp::sum, d, nd, keepdim), s = reduce(ReduceOp::sum, unary(UnaryOp::square, d), nd, keepdim);
  const double n = double(reduced_numel_of(x, nd));
  s = clamp(binary(BinaryOp::sub, s, binary_scalar(BinaryOp::div, unary(UnaryOp::square, d_sum), n)), 0.0, {});
  double denom = std::max<double>(0.0, n - double(correction));
  Tensor out = binary_scalar(BinaryOp::div, s, denom);  // 0/0 gives NaN, as torch.var
  return half ? out.to(x.dtype()) : out;
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  WEFT_CHECK(x.defined(), "sum_to: input is an undefined tensor");
  WEFT_CHECK(int64_t(shape.size()) <= x.dim() && broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(),
             "sum_to: shape {} does not broadcast to the input's shape {}", shape_str(shape), shape_str(x.shape()));
  int64_t lead = x.dim() - int64_t(shape.size());
  Shape dims;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (d < lead || (shape[size_t(d - lead)] == 1 && x.size(d) != 1)) dims.push_back(d);
  if (dims.empty()) return x;
  return reduce(ReduceOp::sum, x, dims, true).view(shape);
}

}  // namespace weft::kernels
