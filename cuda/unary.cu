// cuda/: unary element-wise ops and their backward (kernels/elementwise.h semantics;
// 16-bit floats compute in float). One kernel per (op, dtype): kernels/scalar_ops.h's
// UnaryFn/GradFn are the math on the arithmetic type, map1/map2 the strided grid-stride loops.
#include "cuda/common.cuh"
#include "kernels/scalar_ops.h"

namespace weft::kernels::cuda {
namespace {
using scalar::GradFn;
using scalar::LibMath;
using scalar::UnaryFn;

// out[i] = f(x[i]); T and O are storage types, f maps storage to storage.
template <class T, class O, class F>
__global__ void map1_kernel(Geometry g, Operands<2> ops, F f) {
  O* o = static_cast<O*>(ops.op[0].data);
  const T* x = static_cast<const T*>(ops.op[1].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[2];
    offsets<2>(i, g, ops, off);
    o[off[0]] = f(x[off[1]]);
  }
}

// out[i] = f(a[i], b[i]), all of storage type T.
template <class T, class F>
__global__ void map2_kernel(Geometry g, Operands<3> ops, F f) {
  T* o = static_cast<T*>(ops.op[0].data);
  const T* a = static_cast<const T*>(ops.op[1].data);
  const T* b = static_cast<const T*>(ops.op[2].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[3];
    offsets<3>(i, g, ops, off);
    o[off[0]] = f(a[off[1]], b[off[2]]);
  }
}

template <class T, class O, class F>
void map1(const Geometry& g, const Operand& out, const Operand& x, F f, cudaStream_t stream) {
  map1_kernel<T, O, F><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<2>({out, x}), f);
  WEFT_CUDA_CHECK_LAUNCH();
}

template <class T, class F>
void map2(const Geometry& g, const Operand& out, const Operand& a, const Operand& b, F f, cudaStream_t stream) {
  map2_kernel<T, F><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<3>({out, a, b}), f);
  WEFT_CUDA_CHECK_LAUNCH();
}

// ---- forward: the formulas are kernels/scalar_ops.h's UnaryFn.

// Storage-to-storage wrapper: load, compute in the arithmetic type, store.
template <class T, UnaryOp OP> struct UnaryStorage {
  __device__ T operator()(T v) const { return store<T>(UnaryFn<OP, LibMath>{}(load(v))); }
};

template <class T> struct LogicalNot {
  __device__ bool operator()(T v) const { return !(load(v) != acc_t<T>(0)); }
};

// ---- backward: gx = g * D(v), D being kernels/scalar_ops.h's GradFn.

template <class T, UnaryOp OP> struct GradStorage {
  __device__ T operator()(T g, T v) const { return store<T>(load(g) * GradFn<OP, LibMath>{}(load(v))); }
};
template <class T> struct NegStorage {
  __device__ T operator()(T g) const { return store<T>(-load(g)); }
};
template <class T> struct ZeroStorage {
  __device__ T operator()(T) const { return store<T>(acc_t<T>(0)); }
};

}  // namespace

void launch_unary(UnaryOp op, const Geometry& g, const Operand& out, const Operand& x, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(x.dtype, [&]<class T>() {
    if (op == UnaryOp::logical_not) return map1<T, bool>(g, out, x, LogicalNot<T>{}, stream);
    bool supported = false;
    scalar::with_unary_op(op, [&]<UnaryOp OP>() {
      if constexpr (scalar::unary_supported<is_float_v<T>, std::is_same_v<T, bool>>(OP)) {
        map1<T, T>(g, out, x, UnaryStorage<T, OP>{}, stream);
        supported = true;
      }
    });
    if (!supported) WEFT_CUDA_FAIL("cuda unary: op not supported for this dtype");
  });
}

void launch_unary_backward(UnaryOp op, const Geometry& g, const Operand& gx, const Operand& grad, const Operand& v,
                           cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_float(grad.dtype, [&]<class T>() {
    scalar::with_unary_op(op, [&]<UnaryOp OP>() {
      if constexpr (OP == UnaryOp::neg) map1<T, T>(g, gx, grad, NegStorage<T>{}, stream);
      else if constexpr (OP == UnaryOp::sign || OP == UnaryOp::logical_not) map1<T, T>(g, gx, grad, ZeroStorage<T>{}, stream);
      else map2<T>(g, gx, grad, v, GradStorage<T, OP>{}, stream);
    });
  });
}

}  // namespace weft::kernels::cuda
