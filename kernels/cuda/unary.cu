// kernels/cuda: unary element-wise ops and their backward (kernels/elementwise.h semantics;
// 16-bit floats compute in float). One kernel per (op, dtype): UnaryF<op> is the math on the
// arithmetic type, map1/map2 the strided grid-stride loops.
#include "kernels/cuda/math.cuh"

namespace weft::kernels::cuda {
namespace {
using namespace math;

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

// ---- forward

template <UnaryOp OP> struct UnaryF {
  template <class A> __device__ A operator()(A v) const {
    if constexpr (std::is_integral_v<A>) {
      if constexpr (OP == UnaryOp::neg) return wrap_sub(A(0), v);
      else if constexpr (OP == UnaryOp::abs) { if constexpr (std::is_signed_v<A>) return v < 0 ? wrap_sub(A(0), v) : v; else return v; }
      else if constexpr (OP == UnaryOp::sign) { if constexpr (std::is_signed_v<A>) return A((v > 0) - (v < 0)); else return A(v > 0); }
      else if constexpr (OP == UnaryOp::relu) { if constexpr (std::is_signed_v<A>) return v < 0 ? A(0) : v; else return v; }
      else return wrap_mul(v, v);  // square
    } else {
      if constexpr (OP == UnaryOp::neg) return -v;
      else if constexpr (OP == UnaryOp::exp) return exp_(v);
      else if constexpr (OP == UnaryOp::log) return log_(v);
      else if constexpr (OP == UnaryOp::sqrt) return sqrt_(v);
      else if constexpr (OP == UnaryOp::rsqrt) return A(1) / sqrt_(v);
      else if constexpr (OP == UnaryOp::abs) return fabs_(v);
      else if constexpr (OP == UnaryOp::tanh) return tanh_(v);
      else if constexpr (OP == UnaryOp::sigmoid) return sigmoid(v);
      else if constexpr (OP == UnaryOp::relu) return v < A(0) ? A(0) : v;  // NaN stays NaN
      else if constexpr (OP == UnaryOp::gelu_tanh) return gelu_tanh(v);
      else if constexpr (OP == UnaryOp::gelu_erf) return gelu_erf(v);
      else if constexpr (OP == UnaryOp::sin) return sin_(v);
      else if constexpr (OP == UnaryOp::cos) return cos_(v);
      else if constexpr (OP == UnaryOp::square) return v * v;
      else if constexpr (OP == UnaryOp::reciprocal) return A(1) / v;
      else if constexpr (OP == UnaryOp::sign) return v > A(0) ? A(1) : v < A(0) ? A(-1) : v;  // NaN stays NaN
      else if constexpr (OP == UnaryOp::log1p) return log1p_(v);
      else return expm1_(v);  // expm1
    }
  }
};

// Storage-to-storage wrapper: load, compute in the arithmetic type, store.
template <class T, UnaryOp OP> struct UnaryStorage {
  __device__ T operator()(T v) const { return store<T>(UnaryF<OP>{}(load(v))); }
};

template <class T> struct LogicalNot {
  __device__ bool operator()(T v) const { return !(load(v) != acc_t<T>(0)); }
};

// Which ops the public layer sends for T (kernels/elementwise.cpp: integers take only these).
template <class T> constexpr bool unary_supported(UnaryOp op) {
  if constexpr (std::is_same_v<T, bool>) return false;  // only logical_not, handled apart
  else if constexpr (is_float_v<T>) return op != UnaryOp::logical_not;
  else return op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::sign || op == UnaryOp::relu ||
              op == UnaryOp::square;
}

// Calls fn.template operator()<OP>() for the runtime op (one instantiation per op).
template <class F> void with_unary_op(UnaryOp op, F&& fn) {
  switch (op) {
#define WEFT_CASE(name) case UnaryOp::name: return fn.template operator()<UnaryOp::name>();
    WEFT_CASE(neg) WEFT_CASE(exp) WEFT_CASE(log) WEFT_CASE(sqrt) WEFT_CASE(rsqrt) WEFT_CASE(abs)
    WEFT_CASE(tanh) WEFT_CASE(sigmoid) WEFT_CASE(relu) WEFT_CASE(gelu_tanh) WEFT_CASE(gelu_erf)
    WEFT_CASE(sin) WEFT_CASE(cos) WEFT_CASE(square) WEFT_CASE(reciprocal) WEFT_CASE(sign)
    WEFT_CASE(log1p) WEFT_CASE(expm1) WEFT_CASE(logical_not)
#undef WEFT_CASE
  }
  WEFT_CUDA_FAIL("cuda unary: unknown op");
}

// ---- backward: gx = g * D(v), v being x or y as kernels/elementwise.h says.

template <UnaryOp OP> struct GradF {
  template <class A> __device__ A operator()(A v) const {
    if constexpr (OP == UnaryOp::exp) return v;                       // y
    else if constexpr (OP == UnaryOp::log) return A(1) / v;           // x
    else if constexpr (OP == UnaryOp::sqrt) return A(0.5) / v;        // y
    else if constexpr (OP == UnaryOp::rsqrt) return A(-0.5) * v * v * v;  // y
    else if constexpr (OP == UnaryOp::abs) return v > A(0) ? A(1) : v < A(0) ? A(-1) : A(0);
    else if constexpr (OP == UnaryOp::tanh) return A(1) - v * v;      // y
    else if constexpr (OP == UnaryOp::sigmoid) return v * (A(1) - v); // y
    else if constexpr (OP == UnaryOp::relu) return v > A(0) ? A(1) : A(0);
    else if constexpr (OP == UnaryOp::gelu_tanh) return gelu_tanh_grad(v);
    else if constexpr (OP == UnaryOp::gelu_erf) return gelu_erf_grad(v);
    else if constexpr (OP == UnaryOp::sin) return cos_(v);
    else if constexpr (OP == UnaryOp::cos) return -sin_(v);
    else if constexpr (OP == UnaryOp::square) return A(2) * v;
    else if constexpr (OP == UnaryOp::reciprocal) return -v * v;     // y
    else if constexpr (OP == UnaryOp::log1p) return A(1) / (A(1) + v);
    else return exp_(v);  // expm1
  }
};

template <class T, UnaryOp OP> struct GradStorage {
  __device__ T operator()(T g, T v) const { return store<T>(load(g) * GradF<OP>{}(load(v))); }
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
    with_unary_op(op, [&]<UnaryOp OP>() {
      if constexpr (unary_supported<T>(OP)) map1<T, T>(g, out, x, UnaryStorage<T, OP>{}, stream);
      else WEFT_CUDA_FAIL("cuda unary: op not supported for this dtype");
    });
  });
}

void launch_unary_backward(UnaryOp op, const Geometry& g, const Operand& gx, const Operand& grad, const Operand& v,
                           cudaStream_t stream) {
  if (g.numel == 0) return;
  dispatch_float(grad.dtype, [&]<class T>() {
    with_unary_op(op, [&]<UnaryOp OP>() {
      if constexpr (OP == UnaryOp::neg) map1<T, T>(g, gx, grad, NegStorage<T>{}, stream);
      else if constexpr (OP == UnaryOp::sign || OP == UnaryOp::logical_not) map1<T, T>(g, gx, grad, ZeroStorage<T>{}, stream);
      else map2<T>(g, gx, grad, v, GradStorage<T, OP>{}, stream);
    });
  });
}

}  // namespace weft::kernels::cuda
