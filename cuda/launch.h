// cuda/: the interface between the host side of the backend (ops.cpp, copy.cpp:
// g++, tensors) and the kernels (*.cu: nvcc). nvcc cannot compile fmt, hence core/tensor.h,
// so tensors cross this line as plain descriptors: a Geometry (the shape shared by all
// operands of an element-wise op, after merging dims) and one Operand (pointer + dtype +
// strides in elements) per tensor. Every launch_* function queues its kernels on `stream`,
// checks the launch, and returns without waiting.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/op_kinds.h"

namespace weft::kernels::cuda {

// Element-wise kernels index up to this many dims (after merging adjacent dims that are
// contiguous in every operand, real tensors have at most a few).
inline constexpr int kMaxDims = 8;

struct Geometry {
  int64_t numel = 0;
  int ndim = 0;              // 0..kMaxDims; sizes[ndim-1] is the innermost dim
  bool contiguous = false;   // every operand is contiguous: index i is element i everywhere
  int64_t sizes[kMaxDims] = {};
};

struct Operand {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t strides[kMaxDims] = {};  // in elements, for Geometry's (merged) dims
};

// ---- copies and fills (copy.cu)
// dst = convert(src) element-wise, any dtype pair (the conversions of core/copy.h's
// convert_scalar: through float for 16-bit floats, != 0 for bool).
void launch_copy(const Geometry& g, const Operand& dst, const Operand& src, cudaStream_t stream);

// ---- element-wise (elementwise.cu): the semantics of kernels/cpu/elementwise.cpp. The host
// side has already converted and broadcast operands as the public entry points document.
void launch_unary(UnaryOp op, const Geometry& g, const Operand& out, const Operand& x, cudaStream_t stream);
// gx = grad * op'(v) where v is x or y as kernels/elementwise.h says (unused for neg/sign/
// logical_not, then v.data may be null).
void launch_unary_backward(UnaryOp op, const Geometry& g, const Operand& gx, const Operand& grad, const Operand& v,
                           cudaStream_t stream);
void launch_binary(BinaryOp op, const Geometry& g, const Operand& out, const Operand& a, const Operand& b,
                   cudaStream_t stream);
void launch_binary_scalar(BinaryOp op, const Geometry& g, const Operand& out, const Operand& a, double s,
                          bool scalar_first, cudaStream_t stream);
void launch_add_(const Geometry& g, const Operand& dst, const Operand& src, double alpha, cudaStream_t stream);
void launch_mul_scalar_(const Geometry& g, const Operand& dst, double s, cudaStream_t stream);
void launch_where(const Geometry& g, const Operand& out, const Operand& cond, const Operand& a, const Operand& b,
                  cudaStream_t stream);
void launch_masked_fill(const Geometry& g, const Operand& out, const Operand& x, const Operand& mask, double value,
                        cudaStream_t stream);
void launch_clamp(const Geometry& g, const Operand& out, const Operand& x, bool has_lo, double lo, bool has_hi,
                  double hi, cudaStream_t stream);

// ---- reductions (reduce.cu) over contiguous x read as [outer, reduced, inner, inner_reduced]
// (kernels/cpu/reduce.h), into contiguous out [outer, inner] of dtype out_dtype.
void launch_reduce(ReduceOp op, const void* x, DType x_dtype, void* out, DType out_dtype, int64_t outer,
                   int64_t reduced, int64_t inner, int64_t inner_reduced, cudaStream_t stream);
// Values (x's dtype) and i64 indices of the max/min over `reduced` of [outer, reduced, inner].
void launch_arg_reduce(bool is_max, const void* x, DType dtype, void* values, int64_t* indices, int64_t outer,
                       int64_t reduced, int64_t inner, cudaStream_t stream);

// ---- indexing (indexing.cu)
// out[i, :] = weight[index[i], :] for contiguous weight [V, D], index [N], out [N, D].
void launch_embedding(const void* weight, DType dtype, const void* index, DType index_dtype, int64_t n,
                      int64_t dim, void* out, cudaStream_t stream);

// ---- the other index ops (indexing_backward.cu). Indices are i64 or i32 and already
// range-checked by the host. Accumulations are atomic adds: the order of the adds into one
// element varies, so float sums may differ in the last bits between runs. Their output dtype
// is the source's, or f32 for a bf16/f16 source (the host converts the f32 result back);
// + means wrap-around for integers and logical or for bool, as on the CPU.
// out[o, j, k] = x[o, index[j], k] for contiguous x [outer, mid, inner], index [len] and
// out [outer, len, inner].
void launch_index_select(const void* x, DType dtype, int64_t outer, int64_t mid, int64_t inner, const void* index,
                         DType index_dtype, int64_t len, void* out, cudaStream_t stream);
// out[o, index[j], k] += src[o, j, k] for contiguous out [outer, mid, inner], index [len] and
// src [outer, len, inner]. embedding_backward is the case outer = 1.
void launch_index_add(void* out, DType out_dtype, int64_t outer, int64_t mid, int64_t inner, const void* index,
                      DType index_dtype, int64_t len, const void* src, DType src_dtype, cudaStream_t stream);
// For every position c of index (contiguous, shape g: g.sizes[0..g.ndim) are index's dims,
// unmerged; g.numel its size): out[c] = x[c with c[dim] = index[c]], out contiguous of index's
// shape, x any strides (x.strides per index dim).
void launch_gather(const Geometry& g, int dim, const Operand& x, const void* index, DType index_dtype, void* out,
                   cudaStream_t stream);
// For every position c of index (as in launch_gather): out[c with c[dim] = index[c]] += src[c],
// out and src any strides (per index dim).
void launch_scatter_add(const Geometry& g, int dim, const Operand& out, const void* index, DType index_dtype,
                        const Operand& src, cudaStream_t stream);

}  // namespace weft::kernels::cuda
