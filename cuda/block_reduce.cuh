// cuda/: reductions across the threads of a block, for the kernels that give one block
// to each row (softmax, layer norm, cross-entropy). Every thread of the block must call them
// (they synchronise); all threads get the result. blockDim.x must be a multiple of 32 and at
// most 1024. The combination order depends only on the block size, so results are
// deterministic. Device-only header.
#pragma once
#include "cuda/common.cuh"

namespace weft::kernels::cuda {

struct SumOp {
  template <class A> __device__ A operator()(A a, A b) const { return a + b; }
};
// NaN wins, as in the CPU's max.
struct MaxNanOp {
  template <class A> __device__ A operator()(A a, A b) const { return (a > b || a != a) ? a : b; }
};

template <class A, class Op> __device__ __forceinline__ A warp_reduce(A v, Op op) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// `scratch` holds 32 values of A in shared memory; it may be reused after the call returns.
template <class A, class Op> __device__ A block_reduce(A v, Op op, A* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_reduce(v, op);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  A r = scratch[0];
  for (int i = 1; i < warps; ++i) r = op(r, scratch[i]);
  return r;
}

template <class A> __device__ A block_sum(A v, A* scratch) { return block_reduce(v, SumOp{}, scratch); }
template <class A> __device__ A block_max(A v, A* scratch) { return block_reduce(v, MaxNanOp{}, scratch); }

// Threads per row-block: a warp for short rows up to kThreads for long ones.
inline unsigned row_threads(int64_t n) {
  unsigned t = 32;
  while (t < unsigned(kThreads) && int64_t(t) < n) t *= 2;
  return t;
}

// Blocks for a loop over `rows` rows, one block at a time per row.
inline unsigned row_blocks(int64_t rows) { return unsigned(rows < 1 ? 1 : rows > 65535 ? 65535 : rows); }

// exp and log in the arithmetic type.
__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return ::exp(x); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt_acc(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_acc(double x) { return ::sqrt(x); }

template <class A> __device__ __forceinline__ A neg_inf() { return -A(INFINITY); }

}  // namespace weft::kernels::cuda
