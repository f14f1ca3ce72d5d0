#include "core/generator.h"

#include <cmath>

#include "core/error.h"

namespace weft {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

inline double unit(uint32_t hi, uint32_t lo) {
  return double(((uint64_t(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}
}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
  uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k0 += kWeyl0, k1 += kWeyl1;
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
  }
  return {c0, c1, c2, c3};
}

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter) {
  return philox4x32_10({uint32_t(counter), uint32_t(counter >> 32), 0, 0}, {uint32_t(seed), uint32_t(seed >> 32)});
}

double counter_uniform(uint64_t seed, uint64_t counter) {
  auto x = philox4x32(seed, counter);
  return unit(x[0], x[1]);
}

double counter_normal(uint64_t seed, uint64_t counter) {
  auto x = philox4x32(seed, counter);
  double u1 = 1.0 - unit(x[0], x[1]);  // (0, 1]: the log is finite
  double u2 = unit(x[2], x[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void Generator::manual_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void Generator::set_state(const State& st) {
  seed_ = st.seed;
  offset_ = st.offset;
}

uint64_t Generator::reserve(uint64_t n) {
  WEFT_CHECK(n <= UINT64_MAX - offset_, "Generator: reserving {} counters at offset {} overflows the 64-bit counter",
             n, offset_);
  uint64_t first = offset_;
  offset_ += n;
  return first;
}

uint64_t Generator::next_u64() {
  auto x = philox4x32(seed_, reserve(1));
  return (uint64_t(x[0]) << 32) | x[1];
}
double Generator::uniform() { return counter_uniform(seed_, reserve(1)); }
double Generator::normal() { return counter_normal(seed_, reserve(1)); }

Generator& default_generator() {
  static Generator g(0);
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace weft
