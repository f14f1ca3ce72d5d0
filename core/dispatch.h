// core: turning a runtime DType into a C++ type for templated loops.
//   WEFT_DISPATCH(dtype, "op", [&]<typename T>() { ... });   every dtype
//   WEFT_DISPATCH_FLOAT(dtype, "op", [&]<typename T>() { ... });  f32, f64, bf16, f16
// The lambda is called as fn.template operator()<T>().
#pragma once
#include "dtype.h"
#include "error.h"
#include "half.h"

namespace weft {

template <class F>
decltype(auto) dispatch_dtype(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    case DType::f16: return fn.template operator()<Half>();
    case DType::i64: return fn.template operator()<int64_t>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::u8: return fn.template operator()<uint8_t>();
    case DType::bool_: return fn.template operator()<bool>();
  }
  WEFT_ERROR("{}: unknown dtype {}", op, int(t));
}

template <class F>
decltype(auto) dispatch_float(DType t, const char* op, F&& fn) {
  switch (t) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::bf16: return fn.template operator()<BFloat16>();
    case DType::f16: return fn.template operator()<Half>();
    default: WEFT_ERROR("{}: expected a floating dtype (f32, f64, bf16, f16), got {}", op, dtype_name(t));
  }
}

// The type arithmetic on T is done in: float for 16-bit floats, T otherwise.
template <typename T> struct acc_type { using type = T; };
template <> struct acc_type<BFloat16> { using type = float; };
template <> struct acc_type<Half> { using type = float; };
template <typename T> using acc_t = typename acc_type<T>::type;

}  // namespace weft

#define WEFT_DISPATCH(dtype, op, ...) ::weft::dispatch_dtype(dtype, op, __VA_ARGS__)
#define WEFT_DISPATCH_FLOAT(dtype, op, ...) ::weft::dispatch_float(dtype, op, __VA_ARGS__)
