// cuda/: cross-entropy fused with its log_softmax, one block per row. With label
// smoothing eps over C classes a row's loss is (1-eps)*(-lp[t]) + eps/C * sum_c(-lp[c]), and
// sum_c(-lp[c]) = C*log(sum_c e^(x[c]-max)) - sum_c (x[c]-max) comes out of the same pass (as
// on the CPU). Row losses are kept in double; "mean" and "sum" add them in one block in a
// fixed order, so the reduction is deterministic. A row keeps its max and log-sum (row_stats, in
// the arithmetic type), from which the backward makes the log-probabilities again; 16-bit
// logits are read and their gradient written in their own dtype.
#include "cuda/block_reduce.cuh"
#include "cuda/nn_launch.h"

namespace weft::kernels::cuda {
namespace {

template <class T, class I>
__global__ void cross_entropy_rows(const T* __restrict__ logits, const I* __restrict__ target, int64_t n,
                                   int64_t c, int64_t ignore_index, double eps, acc_t<T>* __restrict__ row_stats,
                                   double* __restrict__ row_loss) {
  using A = acc_t<T>;
  __shared__ A scratch[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const T* x = logits + r * c;
    A mx = neg_inf<A>();
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) mx = MaxNanOp{}(mx, load(x[j]));
    mx = block_max(mx, scratch);
    A sum = 0, xsum = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const A v = load(x[j]) - mx;
      sum += exp_acc(v);
      xsum += v;
    }
    sum = block_sum(sum, scratch);
    xsum = block_sum(xsum, scratch);
    const A ls = log_acc(sum);
    if (threadIdx.x == 0) {
      row_stats[2 * r] = mx;
      row_stats[2 * r + 1] = ls;
      const int64_t t = int64_t(target[r]);
      if (t == ignore_index) {
        row_loss[r] = 0;
      } else {
        const double nll = double(ls) - (double(load(x[t])) - double(mx));
        const double smooth = eps > 0 ? double(c) * double(ls) - double(xsum) : 0.0;  // 0 * inf (a -inf logit) is NaN
        row_loss[r] = (1 - eps) * nll + eps / double(c) * smooth;
      }
    }
  }
}

// loss = the rows' losses in T (reduction none).
template <class T>
__global__ void cross_entropy_store(const double* __restrict__ row_loss, int64_t n, T* __restrict__ loss) {
  using A = acc_t<T>;
  WEFT_CUDA_GRID_STRIDE_LOOP(i, n) loss[i] = store<T>(A(row_loss[i]));
}

// loss[0] = sum (or the mean over `count` non-ignored rows; 0/0 gives NaN as in PyTorch).
template <class T>
__global__ void cross_entropy_total(const double* __restrict__ row_loss, int64_t n, bool mean, int64_t count,
                                    T* __restrict__ loss) {
  using A = acc_t<T>;
  __shared__ double scratch[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += row_loss[i];
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    if (mean) s = count ? s / double(count) : double(NAN);
    loss[0] = store<T>(A(s));
  }
}

// d loss_i / d x_ic = g_i * (p_ic - eps/C - (1-eps) [c == t_i]); ignored rows get 0.
template <class T, class I>
__global__ void cross_entropy_backward_kernel(const acc_t<T>* __restrict__ grad_loss, const T* __restrict__ logits,
                                              const acc_t<T>* __restrict__ row_stats,
                                              const I* __restrict__ target, int64_t n, int64_t c,
                                              int64_t ignore_index, double eps, int reduction, int64_t count,
                                              T* __restrict__ dlogits) {
  using A = acc_t<T>;
  const A off = A(eps / double(c)), hit = A(1 - eps);
  WEFT_CUDA_GRID_STRIDE_LOOP(idx, n * c) {
    const int64_t r = idx / c, j = idx % c;
    const int64_t t = int64_t(target[r]);
    if (t == ignore_index) {
      dlogits[idx] = store<T>(A(0));
      continue;
    }
    A g;
    if (reduction == 0) {
      g = grad_loss[r];
    } else {
      double s = double(grad_loss[0]);
      if (reduction == 1) s = count ? s / double(count) : double(NAN);
      g = A(s);
    }
    A d = g * (exp_acc((load(logits[idx]) - row_stats[2 * r]) - row_stats[2 * r + 1]) - off);
    if (j == t) d -= g * hit;
    dlogits[idx] = store<T>(d);
  }
}

template <class F> void dispatch_target(DType t, F&& fn) {
  if (t == DType::i64) return fn.template operator()<int64_t>();
  if (t == DType::i32) return fn.template operator()<int32_t>();
  WEFT_CUDA_FAIL("cross_entropy: target must be i64 or i32");
}

}  // namespace

void launch_cross_entropy(const void* logits, const void* target, DType target_dtype, DType dtype, int64_t n,
                          int64_t c, int64_t ignore_index, double label_smoothing, int reduction, int64_t count,
                          void* loss, void* row_stats, double* row_loss, cudaStream_t stream) {
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    if (n > 0) {
      dispatch_target(target_dtype, [&]<class I>() {
        cross_entropy_rows<T, I><<<row_blocks(n), row_threads(c), 0, stream>>>(
            static_cast<const T*>(logits), static_cast<const I*>(target), n, c, ignore_index, label_smoothing,
            static_cast<A*>(row_stats), row_loss);
        WEFT_CUDA_CHECK_LAUNCH();
      });
    }
    if (reduction == 0) {
      if (n == 0) return;
      cross_entropy_store<A><<<grid_for(n), kThreads, 0, stream>>>(row_loss, n, static_cast<A*>(loss));
    } else {
      cross_entropy_total<A><<<1, kThreads, 0, stream>>>(row_loss, n, reduction == 1, count,
                                                         static_cast<A*>(loss));
    }
    WEFT_CUDA_CHECK_LAUNCH();
  });
}

void launch_cross_entropy_backward(const void* grad_loss, const void* logits, const void* row_stats, const void* target,
                                   DType target_dtype, DType dtype, int64_t n, int64_t c, int64_t ignore_index,
                                   double label_smoothing, int reduction, int64_t count, void* dlogits,
                                   cudaStream_t stream) {
  if (n * c == 0) return;
  dispatch_float(dtype, [&]<class T>() {
    using A = acc_t<T>;
    dispatch_target(target_dtype, [&]<class I>() {
      cross_entropy_backward_kernel<T, I><<<grid_for(n * c), kThreads, 0, stream>>>(
          static_cast<const A*>(grad_loss), static_cast<const T*>(logits), static_cast<const A*>(row_stats),
          static_cast<const I*>(target), n, c, ignore_index, label_smoothing, reduction, count,
          static_cast<T*>(dlogits));
      WEFT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace weft::kernels::cuda
