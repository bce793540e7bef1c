// Counter-based random numbers: every draw is a pure function of (seed, epoch, index, stream),
// so results never depend on thread count, scheduling or timing. Thread-safe: no state is
// shared; each SampleRng is a small value owned by one caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace batchcast {

// SplitMix64 finaliser: a strong 64-bit mixer.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash_combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

// A deterministic generator for one (seed, epoch, index) triple.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index)
      : state_(hash_combine(hash_combine(seed, epoch), index)) {}
  uint64_t next_u64() { return mix64(state_++); }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }

 private:
  uint64_t state_;
};

// Fisher-Yates over `items`, driven by `rng` alone (the same rng, the same order).
template <typename T>
void shuffle(std::vector<T>& items, SampleRng& rng) {
  for (std::size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[rng.below(i)]);
}

}  // namespace batchcast
