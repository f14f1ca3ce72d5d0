// cuda/: tensors to kernel descriptors, and the CUDA backend functions of the
// element-wise, reduction, cat and index ops (kernels/backend.h has their contracts).
#include "cuda/ops.h"

#include "kernels/backend.h"
#include "cuda/check.h"
#include "cuda/runtime.h"

namespace weft::kernels::cuda {

Geometry plan(const Shape& shape, const std::vector<const Tensor*>& tensors, std::vector<Operand>& operands) {
  const size_t n = tensors.size();
  // Keep dims of size > 1, outermost first.
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> strides(n);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sizes.push_back(shape[d]);
    for (size_t k = 0; k < n; ++k) strides[k].push_back(tensors[k]->stride(int64_t(d)));
  }
  // Merge dim d into d+1 where, in every operand, stepping d is stepping d+1 size[d+1] times.
  for (size_t d = sizes.size(); d-- > 1;) {
    bool mergeable = true;
    for (size_t k = 0; k < n; ++k) mergeable &= strides[k][d - 1] == strides[k][d] * sizes[d];
    if (!mergeable) continue;
    sizes[d - 1] *= sizes[d];
    sizes.erase(sizes.begin() + long(d));
    for (size_t k = 0; k < n; ++k) {
      strides[k][d - 1] = strides[k][d];
      strides[k].erase(strides[k].begin() + long(d));
    }
  }
  WEFT_CHECK(int(sizes.size()) <= kMaxDims,
             "cuda: operands of shape {} need {} dims after merging, more than the {} CUDA element-wise kernels "
             "index (make them contiguous first)", shape_str(shape), sizes.size(), kMaxDims);
  Geometry g;
  g.numel = shape_numel(shape);
  g.ndim = int(sizes.size());
  for (int d = 0; d < g.ndim; ++d) g.sizes[d] = sizes[size_t(d)];
  g.contiguous = true;
  operands.assign(n, Operand{});
  for (size_t k = 0; k < n; ++k) {
    const Tensor& t = *tensors[k];
    operands[k].data = g.numel == 0 ? nullptr : t.data_ptr();
    operands[k].dtype = t.dtype();
    for (int d = 0; d < g.ndim; ++d) operands[k].strides[d] = strides[k][size_t(d)];
    g.contiguous &= g.ndim == 0 || (g.ndim == 1 && strides[k][0] == 1);
  }
  return g;
}

cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index); }

namespace {

// ---------------------------------------------------------------- element-wise

void unary(UnaryOp op, const Tensor& out, const Tensor& x) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &x}, o);
  launch_unary(op, g, o[0], o[1], stream_of(out));
}

void unary_backward(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y) {
  DeviceGuard guard(gx.device().index);
  const Tensor& v = y.defined() ? y : x.defined() ? x : grad;  // grad stands in when nothing is read
  std::vector<Operand> o;
  Geometry g = plan(gx.shape(), {&gx, &grad, &v}, o);
  launch_unary_backward(op, g, o[0], o[1], o[2], stream_of(gx));
}

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &a, &b}, o);
  launch_binary(op, g, o[0], o[1], o[2], stream_of(out));
}

void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &a}, o);
  launch_binary_scalar(op, g, o[0], o[1], s, scalar_first, stream_of(out));
}

// SwiGLU's backward as the three binary kernels the composite launches (the same values), on one stream.
void swiglu_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  Tensor t = empty(grad.shape(), {.dtype = grad.dtype(), .device = grad.device()});
  binary(BinaryOp::mul, t, grad, up);
  binary(BinaryOp::silu_grad_mul, dgate, gate, t);
  binary(BinaryOp::silu_mul, dup, gate, grad);
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  DeviceGuard guard(dst.device().index);
  std::vector<Operand> o;
  Geometry g = plan(dst.shape(), {&dst, &src}, o);
  launch_add_(g, o[0], o[1], alpha, stream_of(dst));
}

void mul_scalar_(const Tensor& dst, double s) {
  DeviceGuard guard(dst.device().index);
  std::vector<Operand> o;
  Geometry g = plan(dst.shape(), {&dst}, o);
  launch_mul_scalar_(g, o[0], s, stream_of(dst));
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &cond, &a, &b}, o);
  launch_where(g, o[0], o[1], o[2], o[3], stream_of(out));
}

void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &x, &mask}, o);
  launch_masked_fill(g, o[0], o[1], o[2], value, stream_of(out));
}

void clamp(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  DeviceGuard guard(out.device().index);
  std::vector<Operand> o;
  Geometry g = plan(out.shape(), {&out, &x}, o);
  launch_clamp(g, o[0], o[1], lo.has_value(), lo.value_or(0), hi.has_value(), hi.value_or(0), stream_of(out));
}

// ---------------------------------------------------------------- reductions

void reduce(ReduceOp op, const Tensor& out, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
            int64_t inner_reduced) {
  DeviceGuard guard(out.device().index);
  launch_reduce(op, x.data_ptr(), x.dtype(), out.data_ptr(), out.dtype(), outer, reduced, inner, inner_reduced,
                stream_of(out));
}

void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x, int64_t outer,
                int64_t reduced, int64_t inner) {
  DeviceGuard guard(values.device().index);
  launch_arg_reduce(is_max, x.data_ptr(), x.dtype(), values.data_ptr(), indices.data<int64_t>(), outer, reduced,
                    inner, stream_of(values));
}

// ---------------------------------------------------------------- nn

void cat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out) {
  // Each input is copied (converting its dtype) into its slice of the output.
  int64_t at = 0;
  for (const Tensor& x : xs) {
    copy(out.narrow(dim, at, x.size(dim)), x);
    at += x.size(dim);
  }
}

// The CPU backend's check on a host copy of the indices (so it waits for the stream). Through the
// CPU table, not kernels/cpu/nn.h: that header's inline OpenMP loops would be compiled here
// without OpenMP, a serial copy of the same inline function (see cuda/meson.build).
void check_index_range(const Tensor& index, int64_t size, const char* op, const std::string& what) {
  cpu::kernel_table().check_index_range(index.to(Device::cpu()), size, op, what);
}

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DeviceGuard guard(out.device().index);
  launch_embedding(weight.data_ptr(), weight.dtype(), indices.data_ptr(), indices.dtype(), indices.numel(),
                   weight.size(1), out.data_ptr(), stream_of(out));
}

// The accumulating ops below (embedding_backward, index_add, scatter_add) add atomically, so
// float results may differ in the last bits between runs.

// [outer, size(dim), inner] around dim, as kernels/cpu/indexing.cpp splits contiguous shapes.
void split3(const Shape& shape, int64_t dim, int64_t& outer, int64_t& mid, int64_t& inner) {
  outer = mid = inner = 1;
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) (d < dim ? outer : d == dim ? mid : inner) *= shape[size_t(d)];
}

// The kernels' view of index's positions: its dims as they are (dim must stay addressable, so
// nothing is merged), and `t`'s strides per dim (t has index's number of dims).
Geometry index_geometry(const char* op, const Tensor& index) {
  WEFT_CHECK(index.dim() <= kMaxDims, "{}: the CUDA kernel indexes at most {} dims, got index {}", op, kMaxDims,
             tensor_desc(index));
  Geometry g;
  g.numel = index.numel();
  g.ndim = int(index.dim());
  for (int d = 0; d < g.ndim; ++d) g.sizes[d] = index.size(d);
  return g;
}
Operand strided_operand(const Tensor& t, int ndim) {
  Operand o;
  o.data = t.data_ptr();
  o.dtype = t.dtype();
  for (int d = 0; d < ndim; ++d) o.strides[d] = t.stride(d);
  return o;
}

// 16-bit floats accumulate in an f32 temporary (atomics on 16-bit values would round at every
// add); the others accumulate in place.
bool accumulates_in_f32(const Tensor& out) { return is_16bit(out.dtype()); }

void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& out) {
  // The caller passes grad already in out's (f32 or f64) dtype: a row-wise index_add.
  if (grad.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  Tensor g = grad.contiguous();
  launch_index_add(out.data_ptr(), out.dtype(), 1, out.size(0), out.size(1), indices.data_ptr(), indices.dtype(),
                   indices.numel(), g.data_ptr(), g.dtype(), stream_of(out));
}

void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  int64_t outer, mid, inner;
  split3(x.shape(), dim, outer, mid, inner);
  launch_index_select(x.data_ptr(), x.dtype(), outer, mid, inner, index.data_ptr(), index.dtype(), index.numel(),
                      out.data_ptr(), stream_of(out));
}

void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  if (src.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  int64_t outer, mid, inner;
  split3(out.shape(), dim, outer, mid, inner);
  const bool f32 = accumulates_in_f32(out);
  Tensor acc = f32 ? out.to(DType::f32) : out;
  launch_index_add(acc.data_ptr(), acc.dtype(), outer, mid, inner, index.data_ptr(), index.dtype(), index.numel(),
                   src.data_ptr(), src.dtype(), stream_of(out));
  if (f32) copy(out, acc);
}

void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  Geometry g = index_geometry("gather", index);
  launch_gather(g, int(dim), strided_operand(x, g.ndim), index.data_ptr(), index.dtype(), out.data_ptr(),
                stream_of(out));
}

void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  if (index.numel() == 0) return;
  DeviceGuard guard(out.device().index);
  Geometry g = index_geometry("scatter_add", index);
  const bool f32 = accumulates_in_f32(out);
  Tensor acc = f32 ? out.to(DType::f32) : out;
  launch_scatter_add(g, int(dim), strided_operand(acc, g.ndim), index.data_ptr(), index.dtype(),
                     strided_operand(src, g.ndim), stream_of(out));
  if (f32) copy(out, acc);
}

}  // namespace

void fill_elementwise_ops(KernelBackend& t) {
  t.unary = &unary;
  t.unary_backward = &unary_backward;
  t.binary = &binary;
  t.binary_scalar = &binary_scalar;
  t.swiglu_backward = &swiglu_backward;
  t.add_ = &add_;
  t.mul_scalar_ = &mul_scalar_;
  t.where = &where;
  t.masked_fill = &masked_fill;
  t.clamp = &clamp;
  t.reduce = &reduce;
  t.arg_reduce = &arg_reduce;
  t.cat = &cat;
  t.check_index_range = &check_index_range;
  t.embedding = &embedding;
  t.embedding_backward = &embedding_backward;
  t.index_select = &index_select;
  t.index_add = &index_add;
  t.gather = &gather;
  t.scatter_add = &scatter_add;
}

}  // namespace weft::kernels::cuda
