// cuda/: the converting, strided element copy behind Tensor::copy_/to/contiguous on
// CUDA tensors (copy.cpp decides when it runs), and so behind fill_ (a copy from a
// broadcast scalar).
#include "cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

template <class D, class S>
__global__ void copy_kernel(Geometry g, Operands<2> ops) {
  D* d = static_cast<D*>(ops.op[0].data);
  const S* s = static_cast<const S*>(ops.op[1].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[2];
    offsets<2>(i, g, ops, off);
    d[off[0]] = convert<D>(s[off[1]]);
  }
}

}  // namespace

void launch_copy(const Geometry& g, const Operand& dst, const Operand& src, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(dst.dtype, [&]<class D>() {
    dispatch_all(src.dtype, [&]<class S>() {
      copy_kernel<D, S><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<2>({dst, src}));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace weft::kernels::cuda
