#include "core/element_search.h"

#include <algorithm>
#include <bit>
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

std::optional<FoundElement> find_nonfinite(const Tensor& t) {
  if (t.defined() && t.device() == kCPU && t.dtype() == kFloat32 && t.is_contiguous()) {  // first a scan of the bits:
    const auto bad = [](float x) { return (std::bit_cast<uint32_t>(x) & 0x7f800000u) == 0x7f800000u; };  // NaN, inf
    if (std::none_of(t.data<float>(), t.data<float>() + t.numel(), bad)) return std::nullopt;
  }
  return find_element(t, [](double v) { return !std::isfinite(v); });
}

}  // namespace weft
