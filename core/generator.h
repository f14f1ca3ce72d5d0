// core: seeded random numbers. A Generator is a deterministic stream (xoshiro256**) that
// gives the same values on every platform and at every world size, so a model initialised
// with seed S has the same full weights however it is later sharded.
#pragma once
#include <cstdint>

namespace weft {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) { manual_seed(seed); }
  void manual_seed(uint64_t seed);
  uint64_t seed() const { return seed_; }
  uint64_t next_u64();
  double uniform();  // [0, 1) with 53 random bits
  float uniform_f();  // [0, 1) with 24 random bits
  double normal();   // standard normal (Box-Muller, both values used)

  struct State { uint64_t s[4]; uint64_t seed; bool has_spare; double spare; };
  State state() const { return {{s_[0], s_[1], s_[2], s_[3]}, seed_, has_spare_, spare_}; }
  void set_state(const State& st);

 private:
  uint64_t s_[4]{};
  uint64_t seed_ = 0;
  bool has_spare_ = false;
  double spare_ = 0;
};

// The process-wide default generator used when a factory is given none.
Generator& default_generator();
void manual_seed(uint64_t seed);

}  // namespace weft
