// core: element types, their sizes and names, and type promotion.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace weft {

enum class DType : uint8_t { f32, f64, bf16, f16, i64, i32, u8, bool_ };

inline constexpr DType kFloat32 = DType::f32;
inline constexpr DType kFloat64 = DType::f64;
inline constexpr DType kBFloat16 = DType::bf16;
inline constexpr DType kFloat16 = DType::f16;
inline constexpr DType kInt64 = DType::i64;
inline constexpr DType kInt32 = DType::i32;
inline constexpr DType kUInt8 = DType::u8;
inline constexpr DType kBool = DType::bool_;

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
bool is_floating(DType t);             // f32, f64, bf16, f16
bool is_16bit(DType t);                // bf16, f16: stored in 16 bits, computed in f32
bool is_integral(DType t);             // i64, i32, u8, bool
// Result type of a binary op on a and b: floating beats integral; among floats the wider
// wins; bf16 with f16 gives f32; among integers the wider wins (bool < u8 < i32 < i64).
DType promote_types(DType a, DType b);

}  // namespace weft
