// cuda/: what the host side of the CUDA backend shares: tensors to kernel descriptors
// (plan), the stream an op runs on, the device copy, and the functions that fill the CUDA
// KernelBackend table. The backend functions themselves (ops.cpp, nn_ops.cpp, gemm.cpp) are
// reached only through that table, with the contracts kernels/backend.h states; each runs on
// the current stream of the tensors' device and returns without waiting (except where noted).
//
// Adding an op: write its kernel and a launch_* function taking Geometry/Operand
// descriptors in a .cu file (declared in launch.h); a backend function in ops.cpp that turns
// tensors into descriptors (plan() below) and calls it; a member in KernelBackend, set here
// in fill_elementwise_ops and in kernels/cpu/backend.cpp; the public entry point calling
// kernel_backend(device, op).my_op(...); and a row in tests/test_cuda_conformance.cpp's table.
#pragma once
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "cuda/launch.h"
#include "kernels/op_kinds.h"

namespace weft::kernels::cuda {

// Descriptors for an element-wise kernel over `shape`, one Operand per tensor (each of that
// shape, any strides, broadcast operands as stride 0). Dims of size 1 are dropped and
// adjacent dims merged where every operand allows; throws if more than kMaxDims remain.
Geometry plan(const Shape& shape, const std::vector<const Tensor*>& tensors, std::vector<Operand>& operands);

// The stream work on `t`'s device goes to (current_stream(t.device().index)).
cudaStream_t stream_of(const Tensor& t);

// The CUDA KernelBackend table (kernels/backend.h) is filled in parts, each by the file that
// defines those backend functions, and registered by register.cpp.
void fill_elementwise_ops(KernelBackend& table);  // ops.cpp: element-wise, reductions, cat, indexing
void fill_nn_ops(KernelBackend& table);           // nn_ops.cpp: nn, optimizers, attention
void fill_gemm_ops(KernelBackend& table);         // gemm.cpp: matmul, dot, gemm

// ---- copies (copy.cpp): registered with core, behind copy_/to/clone/contiguous/fill_ for
// any pair where one side is CUDA. See copy.cpp for when it is asynchronous.
void copy(const Tensor& dst, const Tensor& src);

}  // namespace weft::kernels::cuda
