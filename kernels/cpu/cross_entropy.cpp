// kernels/cpu: cross-entropy fused with its log_softmax, one row per task. With label
// smoothing eps over C classes a row's loss is (1-eps)*(-lp[t]) + eps/C * sum_c(-lp[c]), and
// sum_c(-lp[c]) = C*log(sum_c e^(x[c]-max)) - sum_c (x[c]-max) falls out of the same pass.
// Row losses are summed in row order in double (deterministic). The backward makes lp = (x - max) - log_sum again
// from the logits and the forward's row_stats (max, log_sum): the forward's bits, no [N, C] tensor kept. 16-bit logits
// are read as they are; row_stats, loss and grad_loss are then f32 (acc_t), dlogits 16-bit.
#include <cmath>
#include <limits>
#include <vector>

#include "core/dispatch.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/nn.h"

namespace weft::kernels::cpu {
namespace {

template <class F>
void dispatch_target(DType t, F&& fn) {
  if (t == DType::i64) return fn.template operator()<int64_t>();
  if (t == DType::i32) return fn.template operator()<int32_t>();
  WEFT_ERROR("cross_entropy: target must be i64 or i32, got {}", dtype_name(t));
}

template <typename I>
void check_targets(const Tensor& target, int64_t c, int64_t ignore_index) {
  const I* pt = target.data<I>();
  for (int64_t i = 0; i < target.numel(); ++i) {
    int64_t t = pt[i];
    WEFT_CHECK(t == ignore_index || (t >= 0 && t < c),
               "cross_entropy: target {} (row {}) is out of range for {} classes (ignore_index {})", t, i, c,
               ignore_index);
  }
}

template <typename T, typename I>
void forward_typed(const Tensor& logits, const Tensor& target, int64_t ignore_index, double eps,
                   Reduction reduction, const Tensor& loss, const Tensor& row_stats) {
  using A = acc_t<T>;
  int64_t n = logits.size(0), c = logits.size(1);
  const T* px = logits.data<T>();
  const I* pt = target.data<I>();
  A* ps = row_stats.data<A>();
  std::vector<double> row_loss(n);
#pragma omp parallel for schedule(static) if (n * c > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    const T* x = px + i * c;
    A mx = -std::numeric_limits<A>::infinity(), sum = 0, xsum = 0;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < c; ++j) mx = std::max(mx, A(x[j]));
#pragma omp simd reduction(+ : sum, xsum)
    for (int64_t j = 0; j < c; ++j) {
      sum += fast_exp(A(x[j]) - mx);
      xsum += A(x[j]) - mx;
    }
    A ls = std::log(sum);
    ps[2 * i] = mx;
    ps[2 * i + 1] = ls;
    int64_t t = pt[i];
    if (t == ignore_index) {
      row_loss[i] = 0;
      continue;
    }
    double nll = double(ls) - (double(A(x[t])) - double(mx));
    const double smooth = eps > 0 ? double(c) * double(ls) - double(xsum) : 0.0;  // 0 * inf (a -inf logit) is NaN
    row_loss[i] = (1 - eps) * nll + eps / double(c) * smooth;
  }
  if (reduction == Reduction::none) {
    A* pl = loss.data<A>();
    for (int64_t i = 0; i < n; ++i) pl[i] = A(row_loss[i]);
    return;
  }
  double total = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += row_loss[i];
    count += int64_t(pt[i]) != ignore_index;
  }
  // All targets ignored under "mean" gives 0/0 = NaN, as in PyTorch.
  if (reduction == Reduction::mean) total = count ? total / double(count) : std::nan("");
  *loss.data<A>() = A(total);
}

// d loss_i / d x_ic = g_i * (p_ic - eps/C - (1-eps) [c == t_i]); ignored rows get 0.
template <typename T, typename I>
void backward_typed(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats, const Tensor& target,
                    int64_t ignore_index, double eps, Reduction reduction, const Tensor& dlogits) {
  using A = acc_t<T>;
  int64_t n = logits.size(0), c = logits.size(1);
  const T* px = logits.data<T>();
  const A* ps = row_stats.data<A>();
  const I* pt = target.data<I>();
  const A* pg = grad_loss.data<A>();
  T* pd = dlogits.data<T>();
  double scale = reduction == Reduction::none ? 1.0 : double(A(pg[0]));
  if (reduction == Reduction::mean) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) count += int64_t(pt[i]) != ignore_index;
    scale = count ? scale / double(count) : std::nan("");
  }
  A off = A(eps / double(c)), hit = A(1 - eps);
#pragma omp parallel for schedule(static) if (n * c > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T* d = pd + i * c;
    const T* x = px + i * c;
    const A mx = ps[2 * i], ls = ps[2 * i + 1];
    int64_t t = pt[i];
    if (t == ignore_index) {
      for (int64_t j = 0; j < c; ++j) d[j] = T(A(0));
      continue;
    }
    A g = reduction == Reduction::none ? A(pg[i]) : A(scale);
    // 16-bit logits: the row in f32 first, then rounded once in a loop of its own (vectorised). The next block's
    // logits and dlogits lines are prefetched while one computes (else each store waits for its line: -28 % time).
    static thread_local std::vector<A> wide;
    if constexpr (!std::is_same_v<T, A>) wide.resize(size_t(c));
    A* row = std::is_same_v<T, A> ? reinterpret_cast<A*>(d) : wide.data();
    constexpr int64_t kBlock = 512, kLine = 64 / int64_t(sizeof(T));
    for (int64_t j0 = 0; j0 < c; j0 += kBlock) {
      const int64_t j1 = std::min(c, j0 + kBlock);
      for (int64_t j = j1; j < std::min(c, j1 + kBlock); j += kLine) __builtin_prefetch(x + j), __builtin_prefetch(d + j, 1);
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) row[j] = g * (fast_exp((A(x[j]) - mx) - ls) - off);
    }
    row[t] -= g * hit;
    if constexpr (!std::is_same_v<T, A>)
      for (int64_t j = 0; j < c; ++j) d[j] = T(row[j]);
  }
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                   Reduction reduction, const Tensor& loss, const Tensor& row_stats) {
  dispatch_target(target.dtype(), [&]<typename I>() {
    check_targets<I>(target, logits.size(1), ignore_index);
    dispatch_float(logits.dtype(), "cross_entropy", [&]<typename T>() {
      forward_typed<T, I>(logits, target, ignore_index, label_smoothing, reduction, loss, row_stats);
    });
  });
}

void cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& row_stats,
                            const Tensor& target, int64_t ignore_index, double label_smoothing, Reduction reduction,
                            const Tensor& dlogits) {
  dispatch_target(target.dtype(), [&]<typename I>() {
    check_targets<I>(target, logits.size(1), ignore_index);
    dispatch_float(logits.dtype(), "cross_entropy_backward", [&]<typename T>() {
      backward_typed<T, I>(grad_loss, logits, row_stats, target, ignore_index, label_smoothing, reduction, dlogits);
    });
  });
}

}  // namespace weft::kernels::cpu
