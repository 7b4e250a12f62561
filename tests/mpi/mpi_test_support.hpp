// tests/mpi/mpi_test_support.hpp — the world communicator and helpers shared by the MPI tests.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
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

// Hyperparameters that take every branch of the rules: SGD with momentum, dampening and weight
// decay; Adam/AdamW with weight decay and amsgrad.
inline shardopt::Hyperparams busy_hyperparams(shardopt::Algorithm algorithm) {
  shardopt::Hyperparams h;
  if (algorithm == shardopt::Algorithm::sgd) {
    h.lr = 0.05;
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
  } else {
    h.lr = 0.01;
    h.weight_decay = 0.02;
    h.amsgrad = true;
  }
  return h;
}

// Every parameter's values (f32 parameters), in id order.
inline std::vector<float> all_params(const shardopt::ZeroOptimizer& opt) {
  std::vector<float> out;
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef v = opt.param_view(id);
    out.insert(out.end(), v.as<float>(), v.as<float>() + v.numel);
  }
  return out;
}

// Writes seeded_values(seed + id) into every f32 gradient view: the same on every rank.
inline void write_seeded_grads(shardopt::ZeroOptimizer& opt, uint32_t seed) {
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef g = opt.grad_view(id);
    const std::vector<float> values = seeded_values(seed + static_cast<uint32_t>(id), g.numel);
    if (g.numel > 0) std::memcpy(g.data, values.data(), g.nbytes());
  }
}

// Runs `call` and returns the shardopt::Error it threw (code and message); fails the test if none.
template <typename Call>
std::pair<shardopt::ErrorCode, std::string> error_of(Call&& call) {
  try {
    call();
  } catch (const shardopt::Error& e) {
    return {e.code(), e.what()};
  }
  FAIL("no shardopt::Error was thrown");
  return {shardopt::ErrorCode::internal, ""};
}

}  // namespace shardopt_test
