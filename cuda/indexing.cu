// cuda/: embedding lookup (the host side checks the index range first, see ops.cpp).
#include "cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

// One element of out per thread: row i = index[i] of weight, column j.
template <class T, class I>
__global__ void embedding_kernel(const T* weight, const I* index, int64_t n, int64_t dim, T* out) {
  WEFT_CUDA_GRID_STRIDE_LOOP(e, n * dim) {
    int64_t i = e / dim, j = e - i * dim;
    out[e] = weight[int64_t(index[i]) * dim + j];
  }
}

template <class F> void dispatch_index(DType t, F&& fn) {
  if (t == DType::i64) return fn.template operator()<int64_t>();
  if (t == DType::i32) return fn.template operator()<int32_t>();
  WEFT_CUDA_FAIL("cuda indexing: index tensors must be i64 or i32");
}

}  // namespace

void launch_embedding(const void* weight, DType dtype, const void* index, DType index_dtype, int64_t n, int64_t dim,
                      void* out, cudaStream_t stream) {
  if (n * dim == 0) return;
  // Rows are copied bit for bit, so dtypes of one size share a kernel.
  auto run = [&]<class T>() {
    dispatch_index(index_dtype, [&]<class I>() {
      embedding_kernel<T, I><<<grid_for(n * dim), kThreads, 0, stream>>>(
          static_cast<const T*>(weight), static_cast<const I*>(index), n, dim, static_cast<T*>(out));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  };
  switch (dtype_size(dtype)) {
    case 8: return run.template operator()<uint64_t>();
    case 4: return run.template operator()<uint32_t>();
    case 2: return run.template operator()<uint16_t>();
    default: return run.template operator()<uint8_t>();
  }
}

}  // namespace weft::kernels::cuda
