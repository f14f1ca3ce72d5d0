// cuda/: reductions with the semantics of kernels/cpu/reduce.cpp. One thread block per
// output element: its threads stride over the reduced elements, then combine their partial
// results in shared memory. Float sums and products accumulate in double (as the CPU's
// totals do), integer ones in int64 with wrap-around; max/min propagate NaN; arg max/min
// keep the first index of the extreme value (a NaN wins).
#include <limits>

#include "cuda/common.cuh"

namespace weft::kernels::cuda {
namespace {

// Sum (or mean, with scale = 1/n) into output type O.
template <class T, class O> struct SumR {
  using Acc = std::conditional_t<is_float_v<T>, double, int64_t>;
  double scale;
  Acc init;
  __device__ Acc step(Acc a, T v) const { return merge(a, Acc(load(v))); }
  __device__ Acc merge(Acc a, Acc b) const {
    if constexpr (std::is_integral_v<Acc>) return int64_t(uint64_t(a) + uint64_t(b));  // wraps
    else return a + b;
  }
  __device__ O finish(Acc a) const {
    if constexpr (std::is_integral_v<Acc> && std::is_same_v<O, int64_t>) return a;  // integer sum
    else if constexpr (std::is_integral_v<Acc>) return O(double(a) * scale);       // integer mean: f32
    else return convert<O>(a * scale);
  }
};

// Squares summed in double, returned in double (sum_squares).
template <class T> struct SumSqR {
  using Acc = double;
  double scale;
  Acc init;
  __device__ Acc step(Acc a, T v) const {
    const double x = load(v);
    return a + x * x;
  }
  __device__ Acc merge(Acc a, Acc b) const { return a + b; }
  __device__ double finish(Acc a) const { return a; }
};

template <class T, class O> struct ProdR {
  using Acc = std::conditional_t<is_float_v<T>, double, int64_t>;
  double scale;
  Acc init;
  __device__ Acc step(Acc a, T v) const { return merge(a, Acc(load(v))); }
  __device__ Acc merge(Acc a, Acc b) const {
    if constexpr (std::is_integral_v<Acc>) return int64_t(uint64_t(a) * uint64_t(b));
    else return a * b;
  }
  __device__ O finish(Acc a) const { return convert<O>(a); }
};

// max/min; NaN wins, as torch.max.
template <class T, bool Max> struct ExtR {
  using Acc = acc_t<T>;
  double scale;
  Acc init;  // -inf / +inf or the integer type's extreme, set on the host
  __device__ Acc step(Acc a, T v) const { return merge(a, load(v)); }
  __device__ Acc merge(Acc a, Acc b) const {
    if constexpr (Max) return (a > b || a != a) ? a : b;
    else return (a < b || a != a) ? a : b;
  }
  __device__ T finish(Acc a) const { return store<T>(a); }
};

template <class T, class O, class R>
__global__ void reduce_kernel(const T* x, O* out, int64_t outer, int64_t reduced, int64_t inner,
                              int64_t inner_reduced, R r) {
  using Acc = typename R::Acc;
  __shared__ Acc partial[kThreads];
  const int64_t n_out = outer * inner, n_red = reduced * inner_reduced, row = inner * inner_reduced;
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    int64_t a = o / inner, b = o - a * inner;
    // Element (a, k, b, j) of [outer, reduced, inner, inner_reduced] is at base + k*row + j.
    const T* base = x + a * reduced * row + b * inner_reduced;
    Acc acc = r.init;
    for (int64_t k = threadIdx.x; k < n_red; k += blockDim.x) {
      int64_t kr = k / inner_reduced, j = k - kr * inner_reduced;
      acc = r.step(acc, base[kr * row + j]);
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) partial[threadIdx.x] = r.merge(partial[threadIdx.x], partial[threadIdx.x + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = r.finish(partial[0]);
    __syncthreads();  // partial[] is rewritten for the next output
  }
}

template <class T, class O, class R>
void run_reduce(const void* x, void* out, int64_t outer, int64_t reduced, int64_t inner, int64_t inner_reduced, R r,
                cudaStream_t stream) {
  int64_t n_out = outer * inner;
  unsigned blocks = unsigned(n_out < 65536 ? n_out : 65536);
  reduce_kernel<T, O, R><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<O*>(out), outer,
                                                          reduced, inner, inner_reduced, r);
  WEFT_CUDA_CHECK_LAUNCH();
}

template <class A> A lowest() {
  if constexpr (std::is_floating_point_v<A>) return -std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::lowest();
}
template <class A> A highest() {
  if constexpr (std::is_floating_point_v<A>) return std::numeric_limits<A>::infinity();
  else return std::numeric_limits<A>::max();
}

// ---- arg max/min

// Whether v beats cur: strictly better (so the first of equal values stays), or a NaN
// against a non-NaN.
template <bool Max, class A> __device__ __forceinline__ bool better(A v, A cur) {
  if constexpr (Max) return v > cur || (v != v && cur == cur);
  else return v < cur || (v != v && cur == cur);
}
// Whether (v, i) should replace (bv, bi); bi < 0 marks "nothing yet".
template <bool Max, class A> __device__ __forceinline__ bool better_at(A v, int64_t i, A bv, int64_t bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return better<Max>(v, bv) || (!better<Max>(bv, v) && i < bi);
}

template <class T, bool Max>
__global__ void arg_kernel(const T* x, T* values, int64_t* indices, int64_t outer, int64_t reduced, int64_t inner) {
  using A = acc_t<T>;
  __shared__ A pv[kThreads];
  __shared__ int64_t pi[kThreads];
  const int64_t n_out = outer * inner;
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    int64_t a = o / inner, b = o - a * inner;
    const T* base = x + a * reduced * inner + b;
    A bv = A(0);
    int64_t bi = -1;
    for (int64_t k = threadIdx.x; k < reduced; k += blockDim.x) {
      A v = load(base[k * inner]);
      if (better_at<Max>(v, k, bv, bi)) bv = v, bi = k;
    }
    pv[threadIdx.x] = bv;
    pi[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s && better_at<Max>(pv[threadIdx.x + s], pi[threadIdx.x + s], pv[threadIdx.x], pi[threadIdx.x])) {
        pv[threadIdx.x] = pv[threadIdx.x + s];
        pi[threadIdx.x] = pi[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      values[o] = store<T>(pv[0]);
      indices[o] = pi[0];
    }
    __syncthreads();
  }
}

}  // namespace

void launch_reduce(ReduceOp op, const void* x, DType x_dtype, void* out, DType out_dtype, int64_t outer,
                   int64_t reduced, int64_t inner, int64_t inner_reduced, cudaStream_t stream) {
  if (outer * inner == 0) return;
  double scale = 1.0 / (double(reduced) * double(inner_reduced));
  dispatch_all(x_dtype, [&]<class T>() {
    constexpr bool kFloat = is_float_v<T>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean: {
        bool mean = op == ReduceOp::mean;
        if constexpr (kFloat) {
          run_reduce<T, T>(x, out, outer, reduced, inner, inner_reduced, SumR<T, T>{mean ? scale : 1.0, 0}, stream);
        } else {  // the sum; the front end refuses the mean of integers
          if (out_dtype != DType::i64) WEFT_CUDA_FAIL("cuda sum: integer input needs an i64 output");
          run_reduce<T, int64_t>(x, out, outer, reduced, inner, inner_reduced, SumR<T, int64_t>{1.0, 0}, stream);
        }
        return;
      }
      case ReduceOp::sum_squares:
        if constexpr (kFloat)
          run_reduce<T, double>(x, out, outer, reduced, inner, inner_reduced, SumSqR<T>{1.0, 0}, stream);
        else WEFT_CUDA_FAIL("cuda sum_squares: needs a floating-point input");
        return;
      case ReduceOp::prod: {
        using O = std::conditional_t<kFloat, T, int64_t>;
        run_reduce<T, O>(x, out, outer, reduced, inner, inner_reduced, ProdR<T, O>{1.0, 1}, stream);
        return;
      }
      case ReduceOp::max:
        run_reduce<T, T>(x, out, outer, reduced, inner, inner_reduced, ExtR<T, true>{1.0, lowest<acc_t<T>>()}, stream);
        return;
      case ReduceOp::min:
        run_reduce<T, T>(x, out, outer, reduced, inner, inner_reduced, ExtR<T, false>{1.0, highest<acc_t<T>>()}, stream);
        return;
    }
    WEFT_CUDA_FAIL("cuda reduce: unknown op");
  });
}

void launch_arg_reduce(bool is_max, const void* x, DType dtype, void* values, int64_t* indices, int64_t outer,
                       int64_t reduced, int64_t inner, cudaStream_t stream) {
  int64_t n_out = outer * inner;
  if (n_out == 0) return;
  unsigned blocks = unsigned(n_out < 65536 ? n_out : 65536);
  dispatch_all(dtype, [&]<class T>() {
    const T* px = static_cast<const T*>(x);
    T* pv = static_cast<T*>(values);
    if (is_max) arg_kernel<T, true><<<blocks, kThreads, 0, stream>>>(px, pv, indices, outer, reduced, inner);
    else arg_kernel<T, false><<<blocks, kThreads, 0, stream>>>(px, pv, indices, outer, reduced, inner);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace weft::kernels::cuda
