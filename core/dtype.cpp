#include "core/dtype.h"

namespace weft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::u8: case DType::bool_: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::bool_: return "bool";
  }
  return "?";
}

bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16;
}
bool is_16bit(DType t) { return t == DType::bf16 || t == DType::f16; }

bool is_integral(DType t) { return !is_floating(t); }

static int int_rank(DType t) {
  switch (t) {
    case DType::bool_: return 0;
    case DType::u8: return 1;
    case DType::i32: return 2;
    default: return 3;
  }
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if (a == DType::f64 || b == DType::f64) return DType::f64;
    return DType::f32;  // f32 with a 16-bit float, or bf16 with f16
  }
  return int_rank(a) >= int_rank(b) ? a : b;
}

}  // namespace weft
