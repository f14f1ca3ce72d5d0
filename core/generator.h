// core: seeded random numbers, counter-based. Every random value weft draws is a pure function of (seed, counter):
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) turns the 64-bit counter and the
// 64-bit seed (its key) into 128 random bits. A Generator is a seed plus the next unused counter (its offset); a fill
// of n elements reserves the counters [offset, offset + n) and gives element i the value drawn from counter offset + i.
// So any element of any fill can be computed alone: a rank initialises just its shard of a parameter, bitwise equal to
// the same elements of the whole parameter built in one process, at any world size and on any platform.
#pragma once
#include <array>
#include <cstdint>

namespace weft {

// Philox4x32 with 10 rounds: 128 bits from a 4-word counter and a 2-word key.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);
// weft's draws: the 64-bit counter in words 0-1 (low first), the seed as the key (low first).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter);
// Per-counter draws; each uses one Philox output and nothing else.
double counter_uniform(uint64_t seed, uint64_t counter);  // [0, 1), 53 random bits (words 0-1)
// Standard normal by Box-Muller on two uniforms of one output (words 0-1 and 2-3), cosine
// branch only: one normal per counter, so element i never depends on its neighbours.
double counter_normal(uint64_t seed, uint64_t counter);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);  // offset back to 0
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // the next unused counter
  // Reserves the counters [offset, offset + n) for a fill of n elements and returns the first.
  uint64_t reserve(uint64_t n);
  // Single draws, one counter each.
  uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // standard normal

  struct State {
    uint64_t seed = 0;
    uint64_t offset = 0;
  };
  State state() const { return {seed_, offset_}; }
  void set_state(const State& st);

 private:
  uint64_t seed_ = 0;
  uint64_t offset_ = 0;
};

// The process-wide default generator used when a factory is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace weft
