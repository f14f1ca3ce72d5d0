// kernels/cuda: tensors to kernel descriptors, and the backend functions of ops.h.
#include "kernels/cuda/ops.h"

#include "kernels/cpu/nn.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/runtime.h"

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

cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index).handle(); }

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

void check_index_range(const Tensor& index, int64_t size, const char* op, const std::string& what) {
  cpu::check_index_range(index.to(Device::cpu()), size, op, what);
}

void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DeviceGuard guard(out.device().index);
  launch_embedding(weight.data_ptr(), weight.dtype(), indices.data_ptr(), indices.dtype(), indices.numel(),
                   weight.size(1), out.data_ptr(), stream_of(out));
}

}  // namespace weft::kernels::cuda
