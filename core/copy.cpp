// core: copy_, contiguous, clone, to(dtype|device) and the CPU element copy behind them.
#include "core/copy.h"

#include <cstring>
#include <optional>

#include "core/autograd_meta.h"
#include "core/device_runtime.h"
#include "core/dispatch.h"
#include "core/fill_rule.h"
#include "core/grad_mode.h"
#include "core/op_profiler.h"
#include "core/strided_iter.h"

namespace weft {
namespace {

DeviceCopyFn g_device_copy[kNumDeviceTypes] = {nullptr, nullptr};

template <class D, class S>
void copy_cpu_typed(const Tensor& dst, const Tensor& src) {
  D* d = static_cast<D*>(dst.data_ptr());
  const S* s = static_cast<const S*>(src.data_ptr());
  int64_t n = dst.numel();
  if (dst.is_contiguous() && src.is_contiguous()) {
    if constexpr (std::is_same_v<D, S>) {
      std::memcpy(d, s, size_t(n) * sizeof(D));
    } else {
#pragma omp parallel for if (n > 32768)
      for (int64_t i = 0; i < n; ++i) d[i] = convert_scalar<D>(s[i]);
    }
    return;
  }
  StridedIter<2> it(dst.shape(), {dst.strides(), src.strides()});
#pragma omp parallel for if (n > 32768)
  for (int64_t r = 0; r < it.num_runs(); ++r) {
    auto off = it.run_offsets(r);
    auto [sd, ss] = it.inner_strides();
    D* dp = d + off[0];
    const S* sp = s + off[1];
    if (sd == 1 && ss == 1)  // rows of a wider tensor: the loop vectorises
      for (int64_t i = 0; i < it.inner_size(); ++i) dp[i] = convert_scalar<D>(sp[i]);
    else
      for (int64_t i = 0; i < it.inner_size(); ++i) dp[i * sd] = convert_scalar<D>(sp[i * ss]);
  }
}

// The op profiler's row of a copy: "copy f32", "cast bf16 -> f32", " strided" if either is.
std::string copy_name(const Tensor& dst, const Tensor& src) {
  return fmt::format("{} {}{}", dst.dtype() == src.dtype() ? "copy" : "cast " + std::string(dtype_name(src.dtype())) + " ->",
                     dtype_name(dst.dtype()), dst.is_contiguous() && src.is_contiguous() ? "" : " strided");
}
double copy_bytes(const Tensor& dst, const Tensor& src) {
  return double(dst.numel()) * double(dtype_size(dst.dtype()) + dtype_size(src.dtype()));
}

// The byte range [first, last] that a non-empty tensor's elements span in its storage.
std::pair<int64_t, int64_t> byte_span(const Tensor& t) {
  int64_t last = t.offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {t.offset() * int64_t(t.element_size()), (last + 1) * int64_t(t.element_size()) - 1};
}

// A floating tensor cast to an integer dtype: every value must be one the integer type holds
// (C++ leaves NaN, infinities and the out-of-range undefined); an error names the first that is not.
void check_int_cast(const Tensor& dst, const Tensor& src) {
  if (!is_floating(src.dtype()) || !is_integral(dst.dtype()) || dst.dtype() == DType::bool_) return;
  // Contiguous on the host, the values are read in place: an f64 copy beside the cast's output would be memory
  // that a memory plan (whose meta casts check nothing) does not see. A device's values are read on the host.
  const Tensor v = src.device().is_cpu() && src.is_contiguous() ? src : src.to(Device::cpu(), DType::f64).contiguous();
  WEFT_DISPATCH(v.dtype(), "cast", [&]<typename S>() {
    const S* p = static_cast<const S*>(v.data_ptr());
    for (int64_t i = 0; i < v.numel(); ++i)
      WEFT_CHECK(scalar_fits(convert_scalar<double>(p[i]), dst.dtype()), "cast {} -> {}: element {} of {} is {}, which "
                 "{} cannot hold (NaN, an infinity or out of its range)", dtype_name(src.dtype()),
                 dtype_name(dst.dtype()), i, tensor_desc(src), convert_scalar<double>(p[i]), dtype_name(dst.dtype()));
  });
}

}  // namespace

void register_device_copy(DeviceType type, DeviceCopyFn fn) { g_device_copy[int(type)] = fn; }

void copy_elements(const Tensor& dst, const Tensor& src) {
  WEFT_CHECK(dst.shape() == src.shape(), "copy: shapes differ, dst {} vs src {}", tensor_desc(dst), tensor_desc(src));
  if (dst.numel() == 0) return;
  if (dst.device().is_meta() && src.device().is_meta() && MetaComputeGuard::enabled()) {  // no values to copy
    if (op_profiler::wanted()) op_profiler::Span span(copy_name(dst, src), 0.0, copy_bytes(dst, src));
    return;
  }
  WEFT_CHECK(!dst.device().is_meta() && !src.device().is_meta(),
             "copy: {} to {}: a tensor on the meta device has no data (deferred initialisation: materialise it with "
             "nn::materialize or fsdp::fully_shard its module first)", tensor_desc(src), tensor_desc(dst));
  check_int_cast(dst, src);
  if (dst.device().is_cpu() && src.device().is_cpu()) {
    std::optional<op_profiler::Span> span;
    if (op_profiler::wanted()) span.emplace(copy_name(dst, src), 0.0, copy_bytes(dst, src));
    WEFT_DISPATCH(dst.dtype(), "copy", [&]<typename D>() {
      WEFT_DISPATCH(src.dtype(), "copy", [&]<typename S>() { copy_cpu_typed<D, S>(dst, src); });
    });
    return;
  }
  Device other = dst.device().is_cpu() ? src.device() : dst.device();
  if (g_device_copy[int(other.type)] == nullptr)
    WEFT_CHECK(load_backend(other.type), "copy: {} requested, but {}", other.str(), backend_unavailable_reason(other.type));
  DeviceCopyFn fn = g_device_copy[int(other.type)];
  WEFT_CHECK(fn != nullptr, "copy: no copy routine for device {} (its backend registered none)", other.str());
  fn(dst, src);
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  WEFT_CHECK(src.defined(), "copy_: source is an undefined tensor");
  WEFT_CHECK(!(GradMode::is_enabled() && requires_grad()), "copy_: {} requires grad and cannot be written in place "
             "while grad mode is on: autograd does not record in-place writes (use NoGradGuard, or a new tensor)",
             tensor_desc(*this));
  check_no_grad_view(*this, "copy_");
  for (int64_t d = 0; d < dim(); ++d)
    WEFT_CHECK(stride(d) != 0 || size(d) <= 1, "copy_: {} is expanded (dim {} has stride 0): its elements share "
               "memory, so a copy into it would keep one of several values", tensor_desc(*this), d);
  Tensor s = src.shape() == shape() ? src : src.expand(shape());
  if (numel() > 0 && s.storage() == storage() && (s.offset() != offset() || s.strides() != strides())) {
    const auto [a0, a1] = byte_span(*this);
    const auto [b0, b1] = byte_span(s);
    if (a0 <= b1 && b0 <= a1) s = s.clone();  // overlapping elements: read them all before any is written
  }
  copy_elements(*this, s.detach());
  ++storage()->version;  // autograd's check of the inputs it recorded
  return *this;
}

Tensor Tensor::to(Device device, DType dtype) const {
  check_defined("to");
  if (device == this->device() && dtype == this->dtype()) return *this;
  Tensor out = empty(shape(), {.dtype = dtype, .device = device});
  if (device.is_meta() && this->device().is_meta()) {  // a model built on meta, converted before it is loaded
    const auto rule = MetaComputeGuard::enabled() ? nullptr : recorded_fill(*this);
    WEFT_CHECK(!rule || rule->kind == FillRule::Kind::none, "to: {} on the meta device records {}: convert it to {} "
               "after materialising it (its values would be rounded from the rule, not from {})", tensor_desc(*this),
               rule->str(), dtype_name(dtype), dtype_name(this->dtype()));
    out.storage()->set_deferred_fill(rule);  // none (values a load writes) holds in any dtype
  } else {
    copy_elements(out, detach());
  }
  if (auto fn = detail::autograd_hooks().record_copy; fn && requires_grad()) fn(*this, out);
  return out;
}
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }
Tensor Tensor::to(Device device) const { return to(device, dtype()); }

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty(shape(), {.dtype = dtype(), .device = device()});
  copy_elements(out, detach());
  if (auto fn = detail::autograd_hooks().record_copy; fn && requires_grad()) fn(*this, out);
  return out;
}

Tensor Tensor::contiguous() const {
  check_defined("contiguous");
  return is_contiguous() ? *this : clone();
}

}  // namespace weft
