// tests/mpi/mpi_test_support.hpp — the world communicator and helpers shared by the MPI tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace shardopt_test {

std::shared_ptr<shardopt::Communicator>& world();

// Deterministic values that do not depend on rank: the same on every rank and run.
inline std::vector<float> seeded_values(uint32_t seed, int64_t n, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (float& v : values) v = dist(gen);
  return values;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace shardopt_test
