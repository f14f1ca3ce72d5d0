// kernels: rotary position embeddings (RoPE) in the "rotate half" convention of Hugging Face's
// Llama and GPT-NeoX: for a head of E channels (E even) at position t, channel pair
// (c, c + E/2), c < E/2, is rotated by the angle t * theta^(-2c/E):
//   x'[c] = x[c] cos - x[c + E/2] sin,   x'[c + E/2] = x[c + E/2] cos + x[c] sin.
// The fused attention (kernels/attention.h) applies it to q and k while it reads them; the
// tables here are what it reads.
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace weft::kernels {

// What to rotate: theta 0 means no rotation. Query row i is at position q_pos + i, key row j
// at k_pos + j (both 0 in training; a cached decode step puts its queries after the cache).
struct Rope {
  double theta = 0;
  int64_t q_pos = 0, k_pos = 0;
  bool on() const { return theta != 0; }
};

// cos and sin of every angle, [n_pos, E/2], of `dtype` (f32 or f64) on `device`. The f32
// tables are computed as Hugging Face computes them (the inverse frequencies and the angles
// rounded to f32, then cos and sin), so weft's rotations match a transformers model's; f64
// tables are exact to f64. Tables are cached: the same request returns the same tensors.
struct RopeTables {
  Tensor cos, sin;
};
RopeTables rope_tables(double theta, int64_t E, int64_t n_pos, DType dtype, Device device);

// What a backend's attention receives: the tables (undefined: no rotation) and the positions of
// the first query and key rows.
struct AttentionRope {
  RopeTables tables;
  int64_t q_pos = 0, k_pos = 0;
  bool on() const { return tables.cos.defined(); }
};

// Throws naming `op` unless theta is finite and positive, E even and positions non-negative.
void check_rope(const char* op, const Rope& rope, int64_t E);

}  // namespace weft::kernels
