// cuda/: what the .cu files share: the storage type of each DType on the device, the
// type arithmetic runs in (float for 16-bit floats, as on the CPU), conversions that match
// core/copy.h's convert_scalar, strided offsets, launch sizes and the dtype switch.
// Device-only header: included by .cu files, never by g++-compiled code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/launch.h"

namespace weft::kernels::cuda {

using bf16 = __nv_bfloat16;
using f16 = __half;

template <class T> inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;
template <class T> inline constexpr bool is_float_v = is_half_v<T> || std::is_floating_point_v<T>;

// Arithmetic type of T.
template <class T> struct Acc { using type = T; };
template <> struct Acc<bf16> { using type = float; };
template <> struct Acc<f16> { using type = float; };
template <class T> using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(f16 v) { return __half2float(v); }

// Rounds to nearest even (as weft::BFloat16 / weft::Half on the host).
template <class H> __device__ __forceinline__ H from_float(float v) {
  if constexpr (std::is_same_v<H, bf16>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}

// T -> its arithmetic type and back.
template <class T> __device__ __forceinline__ acc_t<T> load(T v) {
  if constexpr (is_half_v<T>) return to_float(v);
  else return v;
}
template <class T> __device__ __forceinline__ T store(acc_t<T> v) {
  if constexpr (is_half_v<T>) return from_float<T>(v);
  else return v;
}

// core/copy.h's convert_scalar<D>(S) on the device.
template <class D, class S> __device__ __forceinline__ D convert(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (is_half_v<S>) return to_float(s) != 0.f;
    else return s != S(0);
  } else if constexpr (is_half_v<S>) {
    return convert<D>(to_float(s));
  } else if constexpr (is_half_v<D>) {
    return from_float<D>(float(s));
  } else {
    return static_cast<D>(s);
  }
}

// The operands of one element-wise kernel, passed by value as one kernel parameter.
template <int N> struct Operands {
  Operand op[N];
};

template <int N> Operands<N> operands(const Operand (&ops)[N]) {
  Operands<N> r;
  for (int k = 0; k < N; ++k) r.op[k] = ops[k];
  return r;
}

// Offsets (in elements) of linear index i in each of the N operands sharing Geometry g.
template <int N>
__device__ __forceinline__ void offsets(int64_t i, const Geometry& g, const Operands<N>& ops, int64_t (&off)[N]) {
  if (g.contiguous) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
#pragma unroll
  for (int d = kMaxDims - 1; d >= 0; --d) {
    if (d < g.ndim) {
      int64_t s = g.sizes[d];
      int64_t q = i / s;
      int64_t r = i - q * s;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * ops.op[k].strides[d];
      i = q;
    }
  }
}

inline constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill any GPU, few enough that each
// thread does several items on big tensors.
inline unsigned grid_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

#define WEFT_CUDA_GRID_STRIDE_LOOP(i, n)                                                       \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);                    \
       i += int64_t(gridDim.x) * blockDim.x)

// Calls fn.template operator()<T>() with T the device storage type of dtype.
template <class F> void dispatch_all(DType t, F&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<bf16>();
    case DType::f16: return fn.template operator()<f16>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::bool_: return fn.template operator()<bool>();
  }
  WEFT_CUDA_FAIL("cuda: unknown dtype");
}

template <class F> void dispatch_float(DType t, F&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<bf16>();
    case DType::f16: return fn.template operator()<f16>();
    default: WEFT_CUDA_FAIL("cuda: expected a floating dtype");
  }
}

}  // namespace weft::kernels::cuda
