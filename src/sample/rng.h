// A small, fast, seedable random generator: xoshiro256** (Blackman & Vigna), its 256-bit state
// filled from the seed by splitmix64. Fully determined by the seed and copyable, so a sequence's
// state can be saved and replayed (DESIGN §3: per-sequence seeded randomness).
#pragma once

#include <array>
#include <cstdint>

namespace specdec {

class Rng {
 public:
  using State = std::array<uint64_t, 4>;

  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  // A generator in exactly this state (tests, replay). The state must not be all zero.
  static Rng from_state(const State& state) {
    Rng rng;
    rng.s_ = state;
    return rng;
  }

  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& word : s_) word = splitmix64(&x);
  }

  const State& state() const { return s_; }

  // The next 64 random bits.
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1): the top 53 bits as a double.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  // One step of splitmix64 on *x (also usable to derive seeds).
  static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  friend bool operator==(const Rng& a, const Rng& b) { return a.s_ == b.s_; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  State s_;
};

}  // namespace specdec
