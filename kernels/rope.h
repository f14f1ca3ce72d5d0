// kernels: rotary position embeddings (RoPE) in the "rotate half" convention of Hugging Face's
// Llama and GPT-NeoX: for a head of E channels (E even) at position t, channel pair
// (c, c + E/2), c < E/2, is rotated by the angle t * theta^(-2c/E):
//   x'[c] = x[c] cos - x[c + E/2] sin,   x'[c + E/2] = x[c + E/2] cos + x[c] sin.
// The fused attention (kernels/attention.h) applies it to q and k while it reads them; the
// tables here are what it reads. A RopeScaling changes the frequencies theta^(-2c/E) as Hugging
// Face's rope_scaling does, for a context past the one the model was first trained on.
#pragma once
#include <cstdint>

#include "../core/tensor.h"

namespace weft::kernels {

// How the inverse frequencies f_c = theta^(-2c/E) change, as transformers' rope types change
// them (in f32): linear f_c / factor; llama3 f_c / factor for wavelengths 2 pi / f_c past
// original_context / low_freq_factor, f_c below original_context / high_freq_factor, blended
// between; dynamic f_c, what it is up to original_context (max_position_embeddings); past that
// it depends on the sequence's length, which one table per position cannot hold: refused.
struct RopeScaling {
  enum class Kind { none, linear, llama3, dynamic };
  Kind kind = Kind::none;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 0;
  bool operator==(const RopeScaling&) const = default;
};
inline const char* rope_scaling_name(RopeScaling::Kind k) {
  static constexpr const char* kNames[] = {"none", "linear", "llama3", "dynamic"};
  return kNames[int(k)];
}

// What to rotate: theta 0 means no rotation. Query row i is at position q_pos + i, key row j
// at k_pos + j (both 0 in training; a cached decode step puts its queries after the cache).
struct Rope {
  double theta = 0;
  RopeScaling scaling;
  int64_t q_pos = 0, k_pos = 0;
  bool on() const { return theta != 0; }
};

// cos and sin of every angle, [at least n_pos, E/2], of `dtype` (f32 or f64) on `device`. The f32
// tables are computed as Hugging Face computes them (the inverse frequencies and the angles
// rounded to f32, then cos and sin), so weft's rotations match a transformers model's; f64
// tables are exact to f64. Cached: one per rotation and device, the longest requested yet.
struct RopeTables {
  Tensor cos, sin;
};
RopeTables rope_tables(double theta, int64_t E, int64_t n_pos, DType dtype, Device device,
                       const RopeScaling& scaling = {});
// Drops the cached tables on `device`: a memory plan's runs on the meta device each allocate
// (and so count) their own, as the run allocates its tables in its first step and keeps them.
void forget_rope_tables(Device device);

// What a backend's attention receives: the tables (undefined: no rotation) and the positions of
// the first query and key rows.
struct AttentionRope {
  RopeTables tables;
  int64_t q_pos = 0, k_pos = 0;
  bool on() const { return tables.cos.defined(); }
};

// Throws naming `op` unless theta is finite and positive, E even, positions non-negative and the
// scaling's numbers usable (factor > 0, low_freq_factor < high_freq_factor, original_context
// >= 1); n_pos positions must be within a dynamic scaling's original_context.
void check_rope(const char* op, const Rope& rope, int64_t E, int64_t n_pos = 0);
void check_rope_scaling(const char* op, const RopeScaling& scaling);

}  // namespace weft::kernels
