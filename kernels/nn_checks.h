// kernels: argument checks shared by the nn entry points (kernels/nn*.cpp); internal.
#pragma once
#include "../core/tensor.h"

namespace weft::kernels::checks {

inline void check_float(const char* op, const Tensor& t, const char* name) {
  WEFT_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
  WEFT_CHECK(is_floating(t.dtype()), "{}: {} must be a floating tensor (f32, f64, bf16, f16), got {}", op,
             name, tensor_desc(t));
}

inline void check_index(const char* op, const Tensor& t, const char* name) {
  WEFT_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
  WEFT_CHECK(t.dtype() == DType::i64 || t.dtype() == DType::i32, "{}: {} must be i64 or i32, got {}", op,
             name, tensor_desc(t));
}

inline void check_device(const char* op, const Tensor& a, const Tensor& b) {
  WEFT_CHECK(a.device() == b.device(), "{}: tensors are on different devices: {} and {}", op, tensor_desc(a),
             tensor_desc(b));
}

inline void check_same(const char* op, const Tensor& a, const Tensor& b) {
  check_device(op, a, b);
  WEFT_CHECK(a.dtype() == b.dtype(), "{}: dtypes differ: {} and {}", op, tensor_desc(a), tensor_desc(b));
  WEFT_CHECK(a.shape() == b.shape(), "{}: shapes differ: {} and {}", op, tensor_desc(a), tensor_desc(b));
}

// Kernels never record autograd history: they work on detached handles of their inputs.
inline Tensor plain(const Tensor& t) { return t.defined() ? t.detach() : t; }
inline Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
inline TensorOptions like(const Tensor& t) { return {.dtype = t.dtype(), .device = t.device()}; }
// The dtype a float op computes in and keeps its statistics in: f64 for f64, else f32 (16-bit
// values are read and widened in registers).
inline DType stats_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace weft::kernels::checks
