// tools/demo/data.cpp — seeded random streams (splitmix64) behind shardopt-demo's parameters and batches.
#include "data.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace shardopt_demo {

namespace {

// splitmix64: tiny, fast, and the same on every platform, so every rank (and both modes)
// draws exactly the same parameters from the same seed without any communication.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One independent stream per (seed, what, index...) so that the parameters do not depend on
// the order or number of draws made for anything else.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t domain, uint64_t a = 0, uint64_t b = 0) : state_(seed) {
    for (const uint64_t word : {domain, a, b}) {
      state_ ^= word;
      state_ = splitmix64(state_);
    }
  }
  // Uniform in [0, 1) with 24 random bits: exactly representable as a float.
  double uniform() { return static_cast<double>(splitmix64(state_) >> 40) * 0x1.0p-24; }
  // Standard normal (Box-Muller), the demo's torch.randn.
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

enum StreamDomain : uint64_t { weight_stream = 1, bias_stream = 2, input_stream = 3, target_stream = 4 };

}  // namespace

void init_linear(uint64_t seed, int layer, int fan_in, float* weight, int64_t weight_numel,
                 float* bias, int64_t bias_numel) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  Stream w(seed, weight_stream, static_cast<uint64_t>(layer));
  for (int64_t i = 0; i < weight_numel; ++i) weight[i] = static_cast<float>((2.0 * w.uniform() - 1.0) * bound);
  Stream b(seed, bias_stream, static_cast<uint64_t>(layer));
  for (int64_t i = 0; i < bias_numel; ++i) bias[i] = static_cast<float>((2.0 * b.uniform() - 1.0) * bound);
}

void make_batch(uint64_t seed, int rank, std::vector<float>& input, std::vector<float>& target) {
  Stream in(seed, input_stream, static_cast<uint64_t>(rank));
  for (float& x : input) x = static_cast<float>(in.normal());
  Stream tg(seed, target_stream, static_cast<uint64_t>(rank));
  for (float& y : target) y = static_cast<float>(tg.normal());
}

}  // namespace shardopt_demo
