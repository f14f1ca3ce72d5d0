// core: element copies between tensors of the same shape, any dtypes, any strides. The CPU
// path is here; other devices' backends register a copy function for their device type.
#pragma once
#include "tensor.h"

namespace weft {

// Copies src into dst elementwise (shapes must match; dtype converted). If either side is
// on a non-CPU device, the function registered for that device type runs.
void copy_elements(const Tensor& dst, const Tensor& src);

using DeviceCopyFn = void (*)(const Tensor& dst, const Tensor& src);
void register_device_copy(DeviceType type, DeviceCopyFn fn);

// Whether a scalar converts to `dt` defined: always for the floats and bool; for the integer
// dtypes only a number whose integer part the type holds (C++ leaves the rest undefined).
inline bool scalar_fits(double v, DType dt) {
  if (dt == DType::i64) return v >= -0x1p63 && v < 0x1p63;
  if (dt == DType::i32) return v >= -0x1p31 && v < 0x1p31;
  return dt != DType::u8 || (v > -1 && v < 256);
}

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
