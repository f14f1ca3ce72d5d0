// cuda/: binary element-wise ops (tensor-tensor with broadcast operands, and
// tensor-scalar in one kernel), the in-place add_/mul_scalar_, where, masked_fill and clamp,
// with the semantics of kernels/cpu/elementwise.cpp: both take their formulas from
// kernels/scalar_ops.h.
#include "cuda/common.cuh"
#include "kernels/scalar_ops.h"

namespace weft::kernels::cuda {
namespace {
using scalar::AddOp;
using scalar::bound_as;
using scalar::MulOp;
using scalar::scalar_as;

// How the second operand of a binary kernel is given.
enum class Mode : int { tensors, tensor_scalar, scalar_tensor };

// out = op(a, b) (mode tensors), op(a, s) or op(s, a); T storage, O output storage.
template <class Op, class T, class O>
__global__ void binary_kernel(Geometry g, Operands<3> ops, Mode mode, acc_t<T> s) {
  O* o = static_cast<O*>(ops.op[0].data);
  const T* a = static_cast<const T*>(ops.op[1].data);
  const T* b = static_cast<const T*>(ops.op[2].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[3];
    offsets<3>(i, g, ops, off);
    acc_t<T> x = load(a[off[1]]);
    acc_t<T> y = mode == Mode::tensors ? load(b[off[2]]) : s;  // b is only read when given
    auto v = mode == Mode::scalar_tensor ? Op::apply(y, x) : Op::apply(x, y);
    if constexpr (std::is_same_v<O, bool>) o[off[0]] = v;
    else o[off[0]] = store<T>(v);
  }
}

void binary_any(BinaryOp op, const Geometry& g, const Operand& out, const Operand& a, const Operand& b, Mode mode,
                double s, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(a.dtype, [&]<class T>() {
    acc_t<T> sv = scalar_as<acc_t<T>>(s);
    bool supported = scalar::with_binary_op<T, is_float_v<T>>(op, [&]<class Op, class O>() {
      binary_kernel<Op, T, O><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<3>({out, a, b}), mode, sv);
      WEFT_CUDA_CHECK_LAUNCH();
    });
    if (!supported) WEFT_CUDA_FAIL("cuda binary: op not supported for this dtype");
  });
}

// ---- in place and selection kernels

template <class T>
__global__ void add_kernel(Geometry g, Operands<2> ops, bool use_alpha, acc_t<T> alpha) {
  T* d = static_cast<T*>(ops.op[0].data);
  const T* s = static_cast<const T*>(ops.op[1].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[2];
    offsets<2>(i, g, ops, off);
    acc_t<T> v = load(s[off[1]]);
    if (use_alpha) v = MulOp::apply(alpha, v);
    d[off[0]] = store<T>(AddOp::apply(load(d[off[0]]), v));
  }
}

template <class T>
__global__ void mul_scalar_kernel(Geometry g, Operands<1> ops, acc_t<T> s) {
  T* d = static_cast<T*>(ops.op[0].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[1];
    offsets<1>(i, g, ops, off);
    d[off[0]] = store<T>(MulOp::apply(load(d[off[0]]), s));
  }
}

// bool and u8 conditions are both one byte holding 0 or not.
template <class T>
__global__ void where_kernel(Geometry g, Operands<4> ops) {
  T* o = static_cast<T*>(ops.op[0].data);
  const uint8_t* c = static_cast<const uint8_t*>(ops.op[1].data);
  const T* a = static_cast<const T*>(ops.op[2].data);
  const T* b = static_cast<const T*>(ops.op[3].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[4];
    offsets<4>(i, g, ops, off);
    o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <class T>
__global__ void masked_fill_kernel(Geometry g, Operands<3> ops, T value) {
  T* o = static_cast<T*>(ops.op[0].data);
  const T* x = static_cast<const T*>(ops.op[1].data);
  const uint8_t* m = static_cast<const uint8_t*>(ops.op[2].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[3];
    offsets<3>(i, g, ops, off);
    o[off[0]] = m[off[2]] ? value : x[off[1]];
  }
}

// Comparisons are false for NaN, so a NaN input passes through as NaN.
template <class T>
__global__ void clamp_kernel(Geometry g, Operands<2> ops, bool has_lo, acc_t<T> lo, bool has_hi, acc_t<T> hi) {
  T* o = static_cast<T*>(ops.op[0].data);
  const T* x = static_cast<const T*>(ops.op[1].data);
  WEFT_CUDA_GRID_STRIDE_LOOP(i, g.numel) {
    int64_t off[2];
    offsets<2>(i, g, ops, off);
    acc_t<T> a = load(x[off[1]]);
    if (has_lo) a = a < lo ? lo : a;
    if (has_hi) a = a > hi ? hi : a;
    o[off[0]] = store<T>(a);
  }
}

}  // namespace

void launch_binary(BinaryOp op, const Geometry& g, const Operand& out, const Operand& a, const Operand& b,
                   cudaStream_t stream) {
  binary_any(op, g, out, a, b, Mode::tensors, 0.0, stream);
}

void launch_binary_scalar(BinaryOp op, const Geometry& g, const Operand& out, const Operand& a, double s,
                          bool scalar_first, cudaStream_t stream) {
  Operand none;
  none.dtype = a.dtype;
  binary_any(op, g, out, a, none, scalar_first ? Mode::scalar_tensor : Mode::tensor_scalar, s, stream);
}

void launch_add_(const Geometry& g, const Operand& dst, const Operand& src, double alpha, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(dst.dtype, [&]<class T>() {
    add_kernel<T><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<2>({dst, src}), alpha != 1.0,
                                                              scalar_as<acc_t<T>>(alpha));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_mul_scalar_(const Geometry& g, const Operand& dst, double s, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(dst.dtype, [&]<class T>() {
    mul_scalar_kernel<T><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<1>({dst}), scalar_as<acc_t<T>>(s));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_where(const Geometry& g, const Operand& out, const Operand& cond, const Operand& a, const Operand& b,
                  cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(out.dtype, [&]<class T>() {
    where_kernel<T><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<4>({out, cond, a, b}));
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_masked_fill(const Geometry& g, const Operand& out, const Operand& x, const Operand& mask, double value,
                        cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(out.dtype, [&]<class T>() {
    // The fill value as T, computed on the host (the conversions are the device's own).
    acc_t<T> v = scalar_as<acc_t<T>>(value);
    T tv;
    if constexpr (is_half_v<T>) tv = T(v);  // host-side float -> 16-bit, round to nearest even
    else tv = v;
    masked_fill_kernel<T><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<3>({out, x, mask}), tv);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_clamp(const Geometry& g, const Operand& out, const Operand& x, bool has_lo, double lo, bool has_hi,
                  double hi, cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_all(out.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      WEFT_CUDA_FAIL("cuda clamp: not supported for bool");
    } else {
      using A = acc_t<T>;
      clamp_kernel<T><<<grid_for(g.numel), kThreads, 0, stream>>>(g, operands<2>({out, x}), has_lo,
                                                                   bound_as<A>(has_lo ? lo : 0), has_hi,
                                                                   bound_as<A>(has_hi ? hi : 0));
      WEFT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace weft::kernels::cuda
