// core: element copies between tensors of the same shape, any dtypes, any strides. The CPU
// path is here; other devices' backends register a copy function for their device type.
#pragma once
#include "core/tensor.h"

namespace weft {

// Copies src into dst elementwise (shapes must match; dtype converted). If either side is
// on a non-CPU device, the function registered for that device type runs.
void copy_elements(const Tensor& dst, const Tensor& src);

using DeviceCopyFn = void (*)(const Tensor& dst, const Tensor& src);
void register_device_copy(DeviceType type, DeviceCopyFn fn);

// Conversion rules shared with kernels: through float for 16-bit floats, != 0 for bool.
template <class D, class S>
inline D convert_scalar(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>) return float(s) != 0.f;
    else return s != S(0);
  } else if constexpr (std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>) {
    return convert_scalar<D>(float(s));
  } else if constexpr (std::is_same_v<D, BFloat16> || std::is_same_v<D, Half>) {
    return D(float(s));
  } else {
    return static_cast<D>(s);
  }
}

}  // namespace weft
