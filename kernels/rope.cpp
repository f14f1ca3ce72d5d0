// kernels: the rotary tables of kernels/rope.h, computed on the host and cached.
#include "kernels/rope.h"

#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace weft::kernels {

void check_rope_scaling(const char* op, const RopeScaling& s) {
  if (s.kind == RopeScaling::Kind::none) return;
  const char* kind = rope_scaling_name(s.kind);
  WEFT_CHECK(std::isfinite(s.factor) && s.factor > 0, "{}: rope scaling {}: factor must be finite and positive, got {}",
             op, kind, s.factor);
  WEFT_CHECK(s.kind == RopeScaling::Kind::linear || s.original_context >= 1,
             "{}: rope scaling {}: the original context must be >= 1, got {}", op, kind, s.original_context);
  WEFT_CHECK(s.kind != RopeScaling::Kind::llama3 || (std::isfinite(s.low_freq_factor) && s.low_freq_factor > 0 &&
                                                     std::isfinite(s.high_freq_factor) &&
                                                     s.high_freq_factor > s.low_freq_factor),
             "{}: rope scaling llama3: low_freq_factor ({}) must be positive and below high_freq_factor ({})", op,
             s.low_freq_factor, s.high_freq_factor);
}

void check_rope(const char* op, const Rope& rope, int64_t E, int64_t n_pos) {
  WEFT_CHECK(std::isfinite(rope.theta) && rope.theta > 0, "{}: rope theta must be finite and positive, got {}", op,
             rope.theta);
  WEFT_CHECK(rope.theta >= double(std::numeric_limits<float>::min()) && rope.theta <= double(std::numeric_limits<float>::max()),
             "{}: rope theta {} is outside what f32 holds ({} to {}), in which the rotary tables are computed", op,
             rope.theta, std::numeric_limits<float>::min(), std::numeric_limits<float>::max());
  WEFT_CHECK(E % 2 == 0, "{}: rotary embeddings need an even head dim, got {}", op, E);
  WEFT_CHECK(rope.q_pos >= 0 && rope.k_pos >= 0, "{}: rope positions must be non-negative, got q {} and k {}", op,
             rope.q_pos, rope.k_pos);
  check_rope_scaling(op, rope.scaling);
  WEFT_CHECK(rope.scaling.kind != RopeScaling::Kind::dynamic || n_pos <= rope.scaling.original_context,
             "{}: rope scaling dynamic: position {} is past max_position_embeddings {}, where dynamic scaling changes "
             "every frequency with the sequence's length (weft supports it up to max_position_embeddings)",
             op, n_pos - 1, rope.scaling.original_context);
}

namespace {

// The inverse frequencies, each rounded to T, as transformers computes them in f32 (its scalar
// divisions as a reciprocal times the scalar, as torch's __rdiv__ does).
template <typename T>
std::vector<T> inverse_frequencies(double theta, int64_t E, const RopeScaling& s) {
  std::vector<T> f(size_t(E / 2));
  for (int64_t c = 0; c < E / 2; ++c) f[size_t(c)] = T(1) / T(std::pow(T(theta), T(2 * c) / T(E)));
  if (s.kind == RopeScaling::Kind::linear) {
    for (T& x : f) x = x / T(s.factor);
  } else if (s.kind == RopeScaling::Kind::llama3) {
    const T old_ctx = T(s.original_context), factor = T(s.factor), low = T(s.low_freq_factor),
            band = T(s.high_freq_factor - s.low_freq_factor);
    const double low_wavelen = double(s.original_context) / s.low_freq_factor,
                 high_wavelen = double(s.original_context) / s.high_freq_factor;
    for (T& x : f) {
      const T wavelen = (T(1) / x) * T(2 * M_PI);
      if (wavelen > T(low_wavelen)) {
        x = x / factor;
      } else if (!(wavelen < T(high_wavelen))) {  // the medium frequencies: blended
        const T smooth = ((T(1) / wavelen) * old_ctx - low) / band;
        x = (T(1) - smooth) * x / factor + smooth * x;
      }
    }
  }
  return f;
}

template <typename T>
void fill(T* cos_p, T* sin_p, const std::vector<T>& inv_freq, int64_t n_pos) {
  const int64_t half = int64_t(inv_freq.size());
  for (int64_t c = 0; c < half; ++c) {
    // As transformers: angle = t * inv_freq rounded to T; then cos and sin of the rounded angle.
    for (int64_t t = 0; t < n_pos; ++t) {
      const T angle = T(t) * inv_freq[size_t(c)];
      cos_p[t * half + c] = T(std::cos(double(angle)));
      sin_p[t * half + c] = T(std::sin(double(angle)));
    }
  }
}

}  // namespace

namespace {
using RopeKey = std::tuple<double, int64_t, int, std::string, int, double, double, double, int64_t>;
std::mutex rope_mu;
std::map<RopeKey, RopeTables> rope_cache;
}  // namespace

void forget_rope_tables(Device device) {
  std::lock_guard<std::mutex> lock(rope_mu);
  std::erase_if(rope_cache, [&](const auto& entry) { return std::get<3>(entry.first) == device.str(); });
}

RopeTables rope_tables(double theta, int64_t E, int64_t n_pos, DType dtype, Device device, const RopeScaling& scaling) {
  WEFT_CHECK(dtype == DType::f32 || dtype == DType::f64, "rope_tables: dtype must be f32 or f64, got {}",
             dtype_name(dtype));
  check_rope_scaling("rope_tables", scaling);
  // One table per rotation and device, the longest yet (row t does not depend on the length; a longer one replaces it).
  int64_t rounded = 16;
  while (rounded < n_pos) rounded *= 2;
  const RopeKey key{theta, E, int(dtype), device.str(), int(scaling.kind), scaling.factor,
                scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_context};
  std::lock_guard<std::mutex> lock(rope_mu);
  if (auto it = rope_cache.find(key); it != rope_cache.end() && it->second.cos.size(0) >= n_pos) return it->second;
  // Computed on the host whatever the default device (meta while a memory plan runs).
  Tensor c = empty({rounded, E / 2}, {.dtype = dtype, .device = kCPU});
  Tensor s = empty({rounded, E / 2}, {.dtype = dtype, .device = kCPU});
  if (dtype == DType::f64) fill(c.data<double>(), s.data<double>(), inverse_frequencies<double>(theta, E, scaling), rounded);
  else fill(c.data<float>(), s.data<float>(), inverse_frequencies<float>(theta, E, scaling), rounded);
  // A meta run (the memory planner's) needs the shapes only.
  auto place = [&](const Tensor& t) {
    return device.is_meta() ? empty(t.shape(), {.dtype = dtype, .device = device}) : t.to(device);
  };
  RopeTables tables{place(c), place(s)};
  if (rope_cache.size() > 64) rope_cache.clear();  // many distinct rotations: start again rather than grow
  rope_cache.insert_or_assign(key, tables);
  return tables;
}

}  // namespace weft::kernels
