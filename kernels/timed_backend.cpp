// kernels: each device type's KernelBackend table with every entry wrapped in an op-profiler span (core/op_profiler.h),
// handed out while the profiler runs or a step trace records (core/step_trace.h); on a device with streams (cuda) the
// device is waited for before and after, so the span is the op's device time. A row is named for the public op (`op`)
// and its dtype; a GEMM's also names m x n x k and which operands are read transposed (T), attention's its shape
// (BxHxHkvxTqxTkxE[ causal], which a calibration replays). Bytes are the sizes of every tensor operand (a broadcast
// view counts its full shape); FLOPs are counted for the GEMMs (2 m n k) and attention (forward 4 B H Tq Tk C, backward
// 10 B H Tq Tk C: the scores recomputed and four products; halved for a causal square), the ops a compute peak limits.
#include <array>
#include <mutex>
#include <optional>

#include "core/op_profiler.h"
#include "core/stream.h"
#include "kernels/backend.h"

namespace weft::kernels {
namespace {

thread_local const char* t_op = "?";  // the op whose entry runs next on this thread
thread_local const KernelBackend* t_base = nullptr;  // the table whose entry it runs
thread_local Device t_device = kCPU;                  // the device it runs on

void wait_for(Device d) { if (!d.is_cpu() && !d.is_meta()) synchronize(d); }
// wait_for at the end of a scope (a failed kernel reports itself at the next synchronising call).
struct WaitAtEnd { Device d; ~WaitAtEnd() { try { wait_for(d); } catch (...) {} } };

double bytes_of(const Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }
double bytes_of(const std::vector<Tensor>& ts) {
  double sum = 0;
  for (const Tensor& t : ts) sum += bytes_of(t);
  return sum;
}
template <class T>
double bytes_of(const T&) {
  return 0;
}

// The dtype of the first defined tensor operand (the output, for the element-wise entries).
template <class... A>
DType first_dtype(const A&... a) {
  std::optional<DType> d;
  auto visit = [&d](const auto& x) {
    if constexpr (std::is_same_v<std::decay_t<decltype(x)>, Tensor>)
      if (!d && x.defined()) d = x.dtype();
  };
  (visit(a), ...);
  return d.value_or(kFloat32);
}

template <auto X, auto Y>
constexpr bool kSame = false;
template <auto X>
constexpr bool kSame<X, X> = true;

// Name and FLOPs of one call: the GEMMs and attention by shape, the rest by op and dtype.
struct Call {
  std::string name;
  double flops = 0;
};
std::string transposes(const Tensor& a, const Tensor& b) {
  return std::string(a.stride(-1) != 1 ? "T" : "N") + (b.stride(-1) != 1 ? "T" : "N");
}
Call gemm_call(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int64_t m = out.size(-2), n = out.size(-1), k = a.size(-1);
  return {fmt::format("{} {}x{}x{} {} {}", t_op, m, n, k, transposes(a, b), dtype_name(a.dtype())),
          2.0 * double(out.numel()) * double(k)};
}
Call attention_call(const Tensor& q, const Tensor& k, bool causal, double per_product) {
  const double scores = double(q.numel()) * double(k.size(2));  // B H Tq C x Tk
  const bool square = causal && q.size(2) == k.size(2);
  return {fmt::format("{} {}x{}x{}x{}x{}x{}{} {}", t_op, q.size(0), q.size(1), k.size(1), q.size(2), k.size(2),
                      q.size(3), causal ? " causal" : "", dtype_name(q.dtype())),
          per_product * scores * (square ? 0.5 : 1.0)};
}

template <class F, F KernelBackend::*M>
struct Timed;
template <class R, class... A, R (*KernelBackend::*M)(A...)>
struct Timed<R (*)(A...), M> {
  static Call describe(const A&... a) {
    const auto args = std::forward_as_tuple(a...);
    if constexpr (kSame<M, &KernelBackend::gemm> || kSame<M, &KernelBackend::matmul>)
      return gemm_call(std::get<0>(args), std::get<1>(args), std::get<2>(args));
    else if constexpr (kSame<M, &KernelBackend::attention>)
      return attention_call(std::get<0>(args), std::get<1>(args), std::get<3>(args), 4.0);
    else if constexpr (kSame<M, &KernelBackend::attention_backward>)
      return attention_call(std::get<1>(args), std::get<2>(args), std::get<6>(args), 10.0);
    else return {fmt::format("{} {}", t_op, dtype_name(first_dtype(a...))), 0.0};
  }
  static R call(A... a) {
    Call c = describe(a...);
    const KernelBackend& base = *t_base;
    const Device device = t_device;
    wait_for(device);  // the work queued before this op is not its time
    op_profiler::Span span(std::move(c.name), c.flops, (0.0 + ... + bytes_of(a)));
    WaitAtEnd after{device};  // destroyed first: the span ends once the device has finished
    return (base.*M)(a...);
  }
};
#define WEFT_TIMED(entry) t.entry = &Timed<decltype(KernelBackend::entry), &KernelBackend::entry>::call

KernelBackend make_table(const KernelBackend& base) {
  KernelBackend t = base;  // an entry left out here runs base's untimed, never null
  WEFT_TIMED(unary); WEFT_TIMED(unary_backward); WEFT_TIMED(binary); WEFT_TIMED(binary_scalar);
  WEFT_TIMED(swiglu_backward);
  WEFT_TIMED(add_); WEFT_TIMED(mul_scalar_); WEFT_TIMED(where); WEFT_TIMED(masked_fill); WEFT_TIMED(clamp);
  WEFT_TIMED(reduce); WEFT_TIMED(arg_reduce); WEFT_TIMED(matmul); WEFT_TIMED(dot); WEFT_TIMED(gemm);
  WEFT_TIMED(softmax); WEFT_TIMED(softmax_backward); WEFT_TIMED(layer_norm); WEFT_TIMED(layer_norm_backward);
  WEFT_TIMED(cross_entropy); WEFT_TIMED(cross_entropy_backward); WEFT_TIMED(cat); WEFT_TIMED(dropout);
  WEFT_TIMED(dropout_backward); WEFT_TIMED(conv2d); WEFT_TIMED(conv2d_backward); WEFT_TIMED(max_pool2d);
  WEFT_TIMED(max_pool2d_backward); WEFT_TIMED(check_index_range); WEFT_TIMED(embedding);
  WEFT_TIMED(embedding_backward); WEFT_TIMED(index_select); WEFT_TIMED(index_add); WEFT_TIMED(gather);
  WEFT_TIMED(scatter_add); WEFT_TIMED(attention); WEFT_TIMED(attention_backward); WEFT_TIMED(adam_step_);
  WEFT_TIMED(sgd_step_);
  return t;
}
#undef WEFT_TIMED

}  // namespace

const KernelBackend& timed_kernel_table(const char* op, Device device, const KernelBackend& base) {
  static std::array<std::once_flag, kNumDeviceTypes> made;
  static std::array<KernelBackend, kNumDeviceTypes> tables;
  const size_t type = size_t(device.type);
  std::call_once(made[type], [&] { tables[type] = make_table(base); });
  t_op = op;
  t_base = &base;
  t_device = device;
  return tables[type];
}

}  // namespace weft::kernels
