// kernels/cuda: the backend functions that the public entry points (kernels/*.cpp) call for
// CUDA tensors, with the signatures of their kernels/cpu counterparts: arguments are
// checked, outputs allocated, inputs converted and broadcast by the caller, exactly as for
// the CPU. Each runs on the current stream of the tensors' device and returns without
// waiting (except where noted).
//
// Adding an op: write its kernel and a launch_* function taking Geometry/Operand
// descriptors in a .cu file (declared in launch.h), a function here that turns tensors into
// descriptors (plan() below) and calls it, then a branch in the public entry point:
//   #if WEFT_WITH_CUDA
//     else if (x.device().is_cuda()) cuda::my_op(out, x);
//   #endif
// and a row in tests/test_cuda_conformance.cpp's table.
#pragma once
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/launch.h"
#include "kernels/op_kinds.h"

namespace weft::kernels::cuda {

// Descriptors for an element-wise kernel over `shape`, one Operand per tensor (each of that
// shape, any strides, broadcast operands as stride 0). Dims of size 1 are dropped and
// adjacent dims merged where every operand allows; throws if more than kMaxDims remain.
Geometry plan(const Shape& shape, const std::vector<const Tensor*>& tensors, std::vector<Operand>& operands);

// The stream work on `t`'s device goes to (current_stream(t.device().index)).
cudaStream_t stream_of(const Tensor& t);

// ---- element-wise (kernels/elementwise.h)
void unary(UnaryOp op, const Tensor& out, const Tensor& x);
void unary_backward(UnaryOp op, const Tensor& gx, const Tensor& grad, const Tensor& x, const Tensor& y);
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b);
void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& a, double s, bool scalar_first);
void add_(const Tensor& dst, const Tensor& src, double alpha);
void mul_scalar_(const Tensor& dst, double s);
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void masked_fill(const Tensor& out, const Tensor& x, const Tensor& mask, double value);
void clamp(const Tensor& out, const Tensor& x, std::optional<double> lo, std::optional<double> hi);

// ---- reductions (kernels/reduce.h; layouts as kernels/cpu/reduce.h)
void reduce(ReduceOp op, const Tensor& out, const Tensor& x, int64_t outer, int64_t reduced, int64_t inner,
            int64_t inner_reduced = 1);
void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& x, int64_t outer,
                int64_t reduced, int64_t inner);

// ---- nn (kernels/nn.h)
void cat(const std::vector<Tensor>& xs, int64_t dim, const Tensor& out);
// Throws, as the CPU check does, if an index is outside [0, size). Copies the indices to the
// host, so it waits for the stream.
void check_index_range(const Tensor& index, int64_t size, const char* op, const std::string& what);
void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out);
// The rest take kernels/cpu/nn.h's arguments (indices contiguous and range-checked by the
// caller). The accumulating ones (embedding_backward, index_add, scatter_add) add atomically,
// so float results may differ in the last bits between runs; 16-bit outputs accumulate in an
// f32 temporary converted at the end.
void embedding_backward(const Tensor& grad, const Tensor& indices, const Tensor& out);
void index_select(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
void gather(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& out);
void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);

// ---- copies (copy.cpp): registered with core, behind copy_/to/clone/contiguous/fill_ for
// any pair where one side is CUDA. See copy.cpp for when it is asynchronous.
void copy(const Tensor& dst, const Tensor& src);

}  // namespace weft::kernels::cuda
