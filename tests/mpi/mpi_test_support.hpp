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

// Every param's bytes, each read after wait_param (forward order, as the next forward would).
inline std::vector<uint8_t> param_bytes(shardopt::ZeroOptimizer& opt) {
  std::vector<uint8_t> out;
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    opt.wait_param(id);
    const shardopt::TensorRef v = opt.param_view(id);
    const auto* p = static_cast<const uint8_t*>(v.data);
    out.insert(out.end(), p, p + v.nbytes());
  }
  return out;
}

// Hands the trainable f32 params' gradients over in backward order (the last param first), as
// a trainer's backward would: at stage 1 written into grad_view (and grad_ready when
// overlapped), at stage 2 through reduce_gradient. grad_of(id) gives this rank's gradient.
template <typename GradOf>
void hand_gradients_backward(shardopt::ZeroOptimizer& opt, int stage, GradOf&& grad_of) {
  const bool overlapped = opt.config().overlap != shardopt::OverlapPolicy::off;
  for (shardopt::ParamId id = opt.num_params() - 1; id >= 0; --id) {
    if (!opt.trainable(id)) continue;
    std::vector<float> g = grad_of(id);
    if (stage == 1) {
      std::memcpy(opt.grad_view(id).data, g.data(), g.size() * sizeof(float));
      if (overlapped) opt.grad_ready(id);
    } else {
      opt.reduce_gradient(id, shardopt::TensorRef{g.data(), static_cast<int64_t>(g.size())});
    }
  }
}

// Writes seeded_values(seed + id) into every f32 gradient view: the same on every rank.
inline void write_seeded_grads(shardopt::ZeroOptimizer& opt, uint32_t seed) {
  for (shardopt::ParamId id = 0; id < opt.num_params(); ++id) {
    const shardopt::TensorRef g = opt.grad_view(id);
    const std::vector<float> values = seeded_values(seed + static_cast<uint32_t>(id), g.numel);
    if (g.numel > 0) std::memcpy(g.data, values.data(), g.nbytes());
  }
}

// Named f32 params with values that are the same on every rank (seeded_values(seed + i)), and
// gradient buffers for external storage.
struct SeededParams {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;  // external storage only

  explicit SeededParams(const std::vector<std::pair<std::string, int64_t>>& spec, uint32_t seed = 7) {
    for (std::size_t i = 0; i < spec.size(); ++i) {
      names.push_back(spec[i].first);
      values.push_back(seeded_values(seed + static_cast<uint32_t>(i), spec[i].second));
      grads.emplace_back(static_cast<std::size_t>(spec[i].second), 0.f);
    }
  }
  // Named p0, p1, ...
  SeededParams(const std::vector<int64_t>& sizes, uint32_t seed) : SeededParams(named(sizes), seed) {}

  shardopt::ParamGroupSpec group(std::size_t first, std::size_t last, shardopt::GroupHyperparams hyper = {},
                                 bool external = false) {
    shardopt::ParamGroupSpec g;
    g.hyper = hyper;
    for (std::size_t i = first; i < last; ++i) {
      shardopt::ParamSpec p;
      p.name = names[i];
      p.param = shardopt::TensorRef{values[i].data(), static_cast<int64_t>(values[i].size())};
      if (external) p.grad = shardopt::TensorRef{grads[i].data(), static_cast<int64_t>(grads[i].size())};
      g.params.push_back(p);
    }
    return g;
  }
  shardopt::ParamGroupSpec all(shardopt::GroupHyperparams hyper = {}, bool external = false) {
    return group(0, names.size(), hyper, external);
  }

 private:
  static std::vector<std::pair<std::string, int64_t>> named(const std::vector<int64_t>& sizes) {
    std::vector<std::pair<std::string, int64_t>> spec;
    for (std::size_t i = 0; i < sizes.size(); ++i) spec.emplace_back("p" + std::to_string(i), sizes[i]);
    return spec;
  }
};

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
