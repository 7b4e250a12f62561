// tests/mpi/muon_adamw_model.hpp — the Muon + AdamW model of the Muon checkpoint tests and its training loop (also what wrote the format-1 fixture in tests/data/checkpoints).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

namespace shardopt_test {

using shardopt::Algorithm;
using shardopt::ParamGroupSpec;
using shardopt::ParamId;
using shardopt::ParamSpec;
using shardopt::TensorRef;
using shardopt::ZeroOptimizer;

// Multiples of 2^-12 below 1: sums over up to 4 ranks are exact, so every world size averages
// the ranks' identical gradients to that gradient.
inline std::vector<float> exact_values(uint32_t seed, int64_t n) {
  std::vector<float> v = shardopt_test::seeded_values(seed, n);
  for (float& x : v) x = std::round(x * 4096.f) / 4096.f;
  return v;
}

struct Model {
  std::vector<std::string> names = {"embed", "w0", "b0", "w1", "w2", "b2"};
  std::vector<std::vector<int64_t>> shapes = {{40}, {10, 6}, {10}, {4, 12}, {9, 9}, {9}};
  std::vector<std::vector<float>> values;
  Model() {
    for (std::size_t i = 0; i < names.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      values.push_back(exact_values(300u + static_cast<uint32_t>(i), n));
    }
  }
  // Group 0: AdamW over the vectors; group 1: Muon over the matrices.
  std::vector<ParamGroupSpec> groups() {
    std::vector<ParamGroupSpec> out(2);
    out[0].settings.algorithm = Algorithm::adamw;
    out[1].settings.algorithm = Algorithm::muon;
    out[1].hyper.lr = 0.02;
    for (std::size_t i = 0; i < names.size(); ++i) {
      ParamSpec p;
      p.name = names[i];
      p.param = TensorRef{values[i].data(), static_cast<int64_t>(values[i].size())};
      p.shape = shapes[i];
      out[shapes[i].size() == 2 ? 1 : 0].params.push_back(p);
    }
    return out;
  }
};

inline void train(ZeroOptimizer& opt, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    shardopt_test::hand_gradients_backward(opt, opt.config().stage, [&](ParamId id) {
      return exact_values(900u + static_cast<uint32_t>(id * 31 + s), opt.param_view(id).numel);
    });
    opt.reduce_gradients();
    opt.step();
  }
}

}  // namespace shardopt_test
