#include "core/element_search.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace weft {

std::string FoundElement::str() const {
  // A NaN's sign says nothing to a reader: "nan", never "-nan".
  return fmt::format("{} at element {}", std::isnan(value) ? std::string("nan") : fmt::format("{}", value), index);
}

std::optional<FoundElement> find_element(const Tensor& t, const std::function<bool(double)>& bad) {
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype()) || t.device().is_meta()) return std::nullopt;
  // Slices of at most 1M elements, so a large tensor is not copied whole as f64.
  constexpr int64_t kSlice = int64_t(1) << 20;
  const Tensor flat = t.detach().contiguous().view({-1});
  for (int64_t start = 0; start < flat.numel(); start += kSlice) {
    const int64_t n = std::min(kSlice, flat.numel() - start);
    const Tensor h = flat.narrow(0, start, n).to(kCPU, kFloat64).contiguous();
    const double* d = h.data<double>();
    for (int64_t i = 0; i < n; ++i)
      if (bad(d[i])) return FoundElement{start + i, d[i]};
  }
  return std::nullopt;
}

namespace {

// Whether any of n floats stored as U has all exponent bits set (NaN or infinity): or-ed over
// blocks without an early exit, so that the compiler vectorises it, on the OpenMP threads for
// large tensors. A loaded 1B-parameter model is scanned at memory speed.
template <class U>
bool any_exponent_full(const U* p, int64_t n, U exponent) {
  constexpr int64_t kBlock = 1 << 14;
  bool found = false;
#pragma omp parallel for reduction(|| : found) if (n > 8 * kBlock)
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t any = 0;
    for (int64_t i = b; i < e; ++i) any |= uint32_t((p[i] & exponent) == exponent);
    found = found || any != 0;
  }
  return found;
}

}  // namespace

std::optional<FoundElement> find_nonfinite(const Tensor& t) {
  if (t.defined() && t.device() == kCPU && t.is_contiguous()) {  // first a scan of the bits
    const DType d = t.dtype();
    const void* p = t.numel() > 0 ? t.data_ptr() : nullptr;
    if (d == kFloat32 && !any_exponent_full(static_cast<const uint32_t*>(p), t.numel(), uint32_t(0x7f800000u)))
      return std::nullopt;
    if (d == kBFloat16 && !any_exponent_full(static_cast<const uint16_t*>(p), t.numel(), uint16_t(0x7f80u)))
      return std::nullopt;
    if (d == kFloat16 && !any_exponent_full(static_cast<const uint16_t*>(p), t.numel(), uint16_t(0x7c00u)))
      return std::nullopt;
  }
  return find_element(t, [](double v) { return !std::isfinite(v); });
}

}  // namespace weft
