// kernels: the rotary tables of kernels/rope.h, computed on the host and cached.
#include "kernels/rope.h"

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace weft::kernels {

void check_rope(const char* op, const Rope& rope, int64_t E) {
  WEFT_CHECK(std::isfinite(rope.theta) && rope.theta > 0, "{}: rope theta must be finite and positive, got {}", op,
             rope.theta);
  WEFT_CHECK(E % 2 == 0, "{}: rotary embeddings need an even head dim, got {}", op, E);
  WEFT_CHECK(rope.q_pos >= 0 && rope.k_pos >= 0, "{}: rope positions must be non-negative, got q {} and k {}", op,
             rope.q_pos, rope.k_pos);
}

namespace {

template <typename T>
void fill(T* cos_p, T* sin_p, double theta, int64_t E, int64_t n_pos) {
  const int64_t half = E / 2;
  for (int64_t c = 0; c < half; ++c) {
    // As transformers: inv_freq = 1 / theta^(2c / E) and angle = t * inv_freq, each rounded
    // to T; then cos and sin of the rounded angle.
    const T exponent = T(2 * c) / T(E);
    const T inv_freq = T(1) / T(std::pow(T(theta), exponent));
    for (int64_t t = 0; t < n_pos; ++t) {
      const T angle = T(t) * inv_freq;
      cos_p[t * half + c] = T(std::cos(double(angle)));
      sin_p[t * half + c] = T(std::sin(double(angle)));
    }
  }
}

}  // namespace

RopeTables rope_tables(double theta, int64_t E, int64_t n_pos, DType dtype, Device device) {
  WEFT_CHECK(dtype == DType::f32 || dtype == DType::f64, "rope_tables: dtype must be f32 or f64, got {}",
             dtype_name(dtype));
  using Key = std::tuple<double, int64_t, int64_t, int, std::string>;
  static std::mutex mu;
  static std::map<Key, RopeTables> cache;
  // Positions are rounded up to a power of two so that growing sequences reuse a table.
  int64_t rounded = 16;
  while (rounded < n_pos) rounded *= 2;
  const Key key{theta, E, rounded, int(dtype), device.str()};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  // Computed on the host whatever the default device (meta while a memory plan runs).
  Tensor c = empty({rounded, E / 2}, {.dtype = dtype, .device = kCPU});
  Tensor s = empty({rounded, E / 2}, {.dtype = dtype, .device = kCPU});
  if (dtype == DType::f64) fill(c.data<double>(), s.data<double>(), theta, E, rounded);
  else fill(c.data<float>(), s.data<float>(), theta, E, rounded);
  // A meta run (the memory planner's) needs the shapes only.
  auto place = [&](const Tensor& t) {
    return device.is_meta() ? empty(t.shape(), {.dtype = dtype, .device = device}) : t.to(device);
  };
  RopeTables tables{place(c), place(s)};
  if (cache.size() > 64) cache.clear();  // many distinct shapes: start again rather than grow
  cache.emplace(key, tables);
  return tables;
}

}  // namespace weft::kernels
