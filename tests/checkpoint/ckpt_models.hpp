// tests/checkpoint/ckpt_models.hpp — the small two-group models the checkpoint tests train, save and load.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_test {

using namespace shardopt;

inline const std::vector<int64_t> kSizes = {13, 1, 0, 64, 7, 100, 3, 31, 257};

// Initial values and (external storage) the caller's buffers of one optimizer.
struct Model {
  std::vector<std::vector<float>> values;
  std::vector<std::vector<float>> grads;
  Model(const std::vector<int64_t>& sizes, uint32_t seed) {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      values.push_back(seeded_values(seed + static_cast<uint32_t>(i), sizes[i]));
      grads.emplace_back(static_cast<std::size_t>(sizes[i]), 0.f);
    }
  }
};

// A two-group optimizer over `model`; param 2 of the second group is frozen when `freeze`.
inline std::unique_ptr<ZeroOptimizer> make_optimizer(std::shared_ptr<Communicator> comm, const OptimizerConfig& config,
                                              Model& model, const std::vector<int64_t>& sizes = kSizes,
                                              bool freeze = false) {
  std::vector<ParamGroupSpec> groups(2);
  groups[0].hyper = shardopt_test::busy_hyperparams(config.algorithm);
  groups[1].hyper = groups[0].hyper;
  groups[1].hyper.lr = *groups[1].hyper.lr * 0.5;
  groups[1].hyper.maximize = true;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ParamSpec p;
    p.name = "layer" + std::to_string(i) + ".weight";
    p.param = TensorRef{model.values[i].data(), sizes[i]};
    if (config.storage == Storage::external) p.grad = TensorRef{model.grads[i].data(), sizes[i]};
    groups[i < sizes.size() / 2 ? 0 : 1].params.push_back(p);
  }
  auto opt = std::make_unique<ZeroOptimizer>(comm, config, groups);
  if (freeze) opt->set_trainable(static_cast<ParamId>(sizes.size() - 2), false);
  return opt;
}

// Steps [from, to): gradients depend on step and param only; an LR schedule at step 2.
inline void train(ZeroOptimizer& opt, int from, int to) {
  for (int s = from; s < to; ++s) {
    for (ParamId id = 0; id < opt.num_params(); ++id) {
      TensorRef g = opt.grad_view(id);
      const auto values = seeded_values(1000u + static_cast<uint32_t>(s * 97 + id), g.numel);
      if (g.numel > 0) std::memcpy(g.data, values.data(), g.nbytes());
    }
    if (s == 2) opt.hyperparams(0).lr *= 0.1;
    opt.step();
  }
}

inline std::vector<int64_t> all_steps(const ZeroOptimizer& opt) {
  std::vector<int64_t> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) out.push_back(opt.param_step(id));
  return out;
}

}  // namespace shardopt_test
