// cuda/: the index ops beyond the embedding lookup: index_select and gather (pure
// copies), index_add, scatter_add and, through index_add, embedding_backward (accumulations).
// The host side (ops.cpp) checks the index range before launching, as for embedding.
//
// Accumulations use one thread per source element and an atomic add into the output, so
// repeated indices never race; the order of the adds into one element is not fixed, so float
// results may differ in the last bits from run to run (integer and bool results are exact).
// 16-bit floats never accumulate here: the host passes an f32 output and converts it once at
// the end, so that repeated indices do not round at every add.
#include "cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

template <class F> void dispatch_index(DType t, F&& fn) {
  if (t == DType::i64) return fn.template operator()<int64_t>();
  if (t == DType::i32) return fn.template operator()<int32_t>();
  WEFT_CUDA_FAIL("cuda indexing: index tensors must be i64 or i32");
}

// Calls fn<W>() with W an unsigned word as wide as one element: copies move bits, so dtypes of
// one size share a kernel.
template <class F> void dispatch_word(DType t, F&& fn) {
  switch (dtype_size(t)) {
    case 8: return fn.template operator()<uint64_t>();
    case 4: return fn.template operator()<uint32_t>();
    case 2: return fn.template operator()<uint16_t>();
    default: return fn.template operator()<uint8_t>();
  }
}

// The aligned 32-bit word holding byte p and the byte's bit shift in it (little endian). The
// word stays inside p's allocation: the device allocator hands out 512-byte aligned blocks.
__device__ __forceinline__ unsigned int* word_of(void* p, unsigned int& shift) {
  auto a = reinterpret_cast<uintptr_t>(p);
  shift = unsigned(a & 3) * 8;
  return reinterpret_cast<unsigned int*>(a & ~uintptr_t(3));
}

// *p += v atomically, with the CPU backend's meaning of += for each storage type: wrap-around
// for integers, logical or for bool. No 16-bit floats (see the file comment).
template <class T> __device__ __forceinline__ void atomic_accumulate(T* p, T v) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t>) {
    atomicAdd(p, v);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Two's complement: an unsigned add is the same bits as a wrapping signed one.
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    if (!v) return;
    unsigned int shift;
    unsigned int* w = word_of(p, shift);
    atomicOr(w, 1u << shift);
  } else {
    static_assert(std::is_same_v<T, uint8_t>, "atomic_accumulate: unsupported type");
    // No byte-wide atomics: compare-and-swap the word holding it, changing only its byte.
    unsigned int shift;
    unsigned int* w = word_of(p, shift);
    unsigned int old = *w, assumed;
    do {
      assumed = old;
      unsigned int byte = ((assumed >> shift) + unsigned(v)) & 0xffu;
      old = atomicCAS(w, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
    } while (old != assumed);
  }
}

// A source element (storage type S) as a value to add into an output of storage type O: O
// itself, or f32 for a 16-bit source accumulated in f32.
template <class O, class S> __device__ __forceinline__ O as_addend(S v) {
  if constexpr (std::is_same_v<O, S>) return v;
  else return O(load(v));
}

// out[o, j, k] = x[o, index[j], k]; x [outer, mid, inner] and out [outer, len, inner]
// contiguous. One element of out per thread.
template <class W, class I>
__global__ void index_select_kernel(const W* __restrict__ x, int64_t mid, int64_t inner, const I* __restrict__ index,
                                    int64_t len, int64_t total, W* __restrict__ out) {
  WEFT_CUDA_GRID_STRIDE_LOOP(e, total) {
    int64_t k = e % inner, r = e / inner, j = r % len, o = r / len;
    out[e] = x[(o * mid + int64_t(index[j])) * inner + k];
  }
}

// out[o, index[j], k] += src[o, j, k]; src [outer, len, inner] and out [outer, mid, inner]
// contiguous. One element of src per thread.
template <class O, class S, class I>
__global__ void index_add_kernel(O* __restrict__ out, int64_t mid, int64_t inner, const I* __restrict__ index,
                                 int64_t len, int64_t total, const S* __restrict__ src) {
  WEFT_CUDA_GRID_STRIDE_LOOP(e, total) {
    int64_t k = e % inner, r = e / inner, j = r % len, o = r / len;
    atomic_accumulate(out + (o * mid + int64_t(index[j])) * inner + k, as_addend<O>(src[e]));
  }
}

// Offset in an operand with `strides` of the element of index's shape g at linear position e,
// with the coordinate along `dim` replaced by `at` (dim < 0: no replacement).
__device__ __forceinline__ int64_t strided_offset(int64_t e, const Geometry& g, const int64_t* strides, int dim,
                                                  int64_t at) {
  int64_t off = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    int64_t s = g.sizes[d], q = e / s, c = e - q * s;
    off += (d == dim ? at : c) * strides[d];
    e = q;
  }
  return off;
}

// out[e] = x[coords(e) with coordinate dim = index[e]]; index and out contiguous of shape g,
// x any strides. One element of out per thread.
template <class W, class I>
__global__ void gather_kernel(Geometry g, int dim, Operand x, const I* __restrict__ index, W* __restrict__ out) {
  const W* px = static_cast<const W*>(x.data);
  WEFT_CUDA_GRID_STRIDE_LOOP(e, g.numel) {
    out[e] = px[strided_offset(e, g, x.strides, dim, int64_t(index[e]))];
  }
}

// out[coords(e) with coordinate dim = index[e]] += src[coords(e)]; index contiguous of shape
// g, out and src any strides. One element of index per thread.
template <class O, class S, class I>
__global__ void scatter_add_kernel(Geometry g, int dim, Operand out, const I* __restrict__ index, Operand src) {
  O* po = static_cast<O*>(out.data);
  const S* ps = static_cast<const S*>(src.data);
  WEFT_CUDA_GRID_STRIDE_LOOP(e, g.numel) {
    int64_t at = int64_t(index[e]);
    atomic_accumulate(po + strided_offset(e, g, out.strides, dim, at),
                      as_addend<O>(ps[strided_offset(e, g, src.strides, -1, 0)]));
  }
}

// Calls fn<O, S>() with the storage types of an accumulation into out_dtype from src_dtype:
// the same dtype (any but 16-bit floats), or f32 from bf16/f16.
template <class F> void dispatch_accumulate(DType out_dtype, DType src_dtype, F&& fn) {
  if (out_dtype == DType::f32 && src_dtype == DType::bf16) return fn.template operator()<float, bf16>();
  if (out_dtype == DType::f32 && src_dtype == DType::f16) return fn.template operator()<float, f16>();
  if (out_dtype != src_dtype)
    WEFT_CUDA_FAIL("cuda index_add/scatter_add: the output must have the source's dtype, or f32 for 16-bit sources");
  switch (out_dtype) {
    case DType::f32: return fn.template operator()<float, float>();
    case DType::f64: return fn.template operator()<double, double>();
    case DType::i64: return fn.template operator()<int64_t, int64_t>();
    case DType::i32: return fn.template operator()<int32_t, int32_t>();
    case DType::u8: return fn.template operator()<uint8_t, uint8_t>();
    case DType::bool_: return fn.template operator()<bool, bool>();
    default: WEFT_CUDA_FAIL("cuda index_add/scatter_add: 16-bit floats accumulate into an f32 output");
  }
}

}  // namespace

void launch_index_select(const void* x, DType dtype, int64_t outer, int64_t mid, int64_t inner, const void* index,
                         DType index_dtype, int64_t len, void* out, cudaStream_t stream) {
  const int64_t total = outer * len * inner;
  if (total == 0) return;
  dispatch_word(dtype, [&]<class W>() {
    dispatch_index(index_dtype, [&]<class I>() {
      index_select_kernel<W, I><<<grid_for(total), kThreads, 0, stream>>>(
          static_cast<const W*>(x), mid, inner, static_cast<const I*>(index), len, total, static_cast<W*>(out));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_index_add(void* out, DType out_dtype, int64_t outer, int64_t mid, int64_t inner, const void* index,
                      DType index_dtype, int64_t len, const void* src, DType src_dtype, cudaStream_t stream) {
  const int64_t total = outer * len * inner;
  if (total == 0) return;
  dispatch_accumulate(out_dtype, src_dtype, [&]<class O, class S>() {
    dispatch_index(index_dtype, [&]<class I>() {
      index_add_kernel<O, S, I><<<grid_for(total), kThreads, 0, stream>>>(
          static_cast<O*>(out), mid, inner, static_cast<const I*>(index), len, total, static_cast<const S*>(src));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_gather(const Geometry& g, int dim, const Operand& x, const void* index, DType index_dtype, void* out,
                   cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_word(x.dtype, [&]<class W>() {
    dispatch_index(index_dtype, [&]<class I>() {
      gather_kernel<W, I><<<grid_for(g.numel), kThreads, 0, stream>>>(g, dim, x, static_cast<const I*>(index),
                                                                       static_cast<W*>(out));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_scatter_add(const Geometry& g, int dim, const Operand& out, const void* index, DType index_dtype,
                        const Operand& src, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_accumulate(out.dtype, src.dtype, [&]<class O, class S>() {
    dispatch_index(index_dtype, [&]<class I>() {
      scatter_add_kernel<O, S, I><<<grid_for(g.numel), kThreads, 0, stream>>>(g, dim, out,
                                                                              static_cast<const I*>(index), src);
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace weft::kernels::cuda
