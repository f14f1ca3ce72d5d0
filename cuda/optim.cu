// cuda/: fused Adam/AdamW and SGD updates, one thread per element, with exactly the operations of
// kernels/cpu/optim.cpp (PyTorch's single-tensor update) in the same order. nvcc would contract a*b + c into an FMA
// where the CPU rounds twice, so every operation is spelled with its correctly rounded intrinsic (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn, __fmaf_rn and their double forms), which the compiler never fuses or reorders:
// the same inputs give the same bits on both devices.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }

// The scalar factors, rounded to T on the host as the CPU path rounds them.
template <class T> struct AdamConsts {
  T decay, wd, coef, b2, w2, neg_step, bc2_sqrt, eps, gs;
  bool decoupled, has_wd, small;  // small: |1 - beta1| < 0.5, which of lerp's two forms
};

template <class T>
__global__ void adam_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ m, T* __restrict__ v,
                            int64_t n, AdamConsts<T> c) {
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) {
    T pi = p[i], gi = mul_rn(g[i], c.gs);                 // grad.mul_(clip_coef) (x 1: the same bits)
    if (c.has_wd) {
      if (c.decoupled) pi = mul_rn(pi, c.decay);          // param.mul_(1 - lr * wd)
      else gi = fma_rn(c.wd, pi, gi);                      // grad.add(param, alpha=wd)
    }
    const T mi = fma_rn(c.coef, add_rn(gi, -m[i]), c.small ? m[i] : gi);  // exp_avg.lerp_(grad, 1-beta1)
    T vi = mul_rn(v[i], c.b2);                             // exp_avg_sq.mul_(beta2)
    vi = fma_rn(mul_rn(c.w2, gi), gi, vi);                 //   .addcmul_(grad, grad, value=1-beta2)
    const T denom = add_rn(div_rn(sqrt_rn(vi), c.bc2_sqrt), c.eps);
    p[i] = add_rn(pi, div_rn(mul_rn(c.neg_step, mi), denom));  // param.addcdiv_(exp_avg, denom, value=-step)
    m[i] = mi;
    v[i] = vi;
  }
}

template <class T> struct SgdConsts {
  T wd, mom, damp, neg_lr, gs;
  bool has_wd, has_mom, nesterov, first;
};

template <class T>
__global__ void sgd_kernel(T* __restrict__ p, const T* __restrict__ g, T* __restrict__ buf, int64_t n,
                           SgdConsts<T> c) {
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) {
    T d = mul_rn(g[i], c.gs);
    if (c.has_wd) d = fma_rn(c.wd, p[i], d);  // d_p.add(param, alpha=wd)
    if (c.has_mom) {
      // clone on the first step, else buf.mul_(momentum).add_(d_p, alpha=1-dampening)
      const T b = c.first ? d : fma_rn(c.damp, d, mul_rn(buf[i], c.mom));
      buf[i] = b;
      d = c.nesterov ? fma_rn(c.mom, b, d) : b;  // d_p.add(buf, alpha=momentum)
    }
    p[i] = fma_rn(c.neg_lr, d, p[i]);  // param.add_(d_p, alpha=-lr)
  }
}

template <class F> void dispatch_master(DType t, F&& fn) {
  if (t == DType::f32) return fn.template operator()<float>();
  if (t == DType::f64) return fn.template operator()<double>();
  WEFT_CUDA_FAIL("optimizer step: parameters must be f32 or f64 (keep master weights in f32)");
}

}  // namespace

void launch_adam_step(void* param, const void* grad, void* exp_avg, void* exp_avg_sq, DType dtype, int64_t n,
                      const AdamArgs& a, cudaStream_t stream) {
  if (n == 0) return;
  const double bc1 = 1 - std::pow(a.beta1, double(a.step));
  const double bc2 = 1 - std::pow(a.beta2, double(a.step));
  dispatch_master(dtype, [&]<class T>() {
    const T w1 = T(1 - a.beta1), coef = (w1 < T(0) ? -w1 : w1) < T(0.5) ? w1 : T(w1 - T(1));  // lerp's two forms
    AdamConsts<T> c{T(1 - a.lr * a.weight_decay), T(a.weight_decay), coef, T(a.beta2), T(1 - a.beta2),
                    T(-(a.lr / bc1)), T(std::sqrt(bc2)), T(a.eps), T(a.grad_scale), a.decoupled, a.weight_decay != 0,
                    coef == w1};
    adam_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(param), static_cast<const T*>(grad),
                                                          static_cast<T*>(exp_avg), static_cast<T*>(exp_avg_sq), n,
                                                          c);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_sgd_step(void* param, const void* grad, void* momentum_buf, DType dtype, int64_t n, const SgdArgs& a,
                     cudaStream_t stream) {
  if (n == 0) return;
  dispatch_master(dtype, [&]<class T>() {
    SgdConsts<T> c{T(a.weight_decay), T(a.momentum), T(1 - a.dampening), T(-a.lr), T(a.grad_scale), a.weight_decay != 0,
                   a.momentum != 0, a.nesterov, a.first};
    sgd_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(static_cast<T*>(param), static_cast<const T*>(grad),
                                                         static_cast<T*>(momentum_buf), n, c);
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace weft::kernels::cuda
