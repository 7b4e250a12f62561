// tests/mpi/wired_optimizer_parts.hpp — the optimizer's modules wired as ZeroOptimizer wires them, over a given DeviceContext, with seeded f32 parameters: what the device-path tests build on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mpi_test_support.hpp"
#include "optim/device_context.hpp"
#include "optim/grad_reducer.hpp"
#include "optim/param_sync.hpp"
#include "optim/param_table.hpp"
#include "optim/shard_state.hpp"
#include "optim/step.hpp"

namespace shardopt_test {

// One group (the config's defaults) of f32 CPU parameters of `param_sizes` elements in
// bucket_view storage, parameter i starting at seeded_values(10 + i): the same on every rank.
struct WiredOptimizerParts {
  WiredOptimizerParts(std::unique_ptr<shardopt::optim::DeviceContext> context, const shardopt::OptimizerConfig& cfg,
                      std::vector<int64_t> param_sizes)
      : sizes(std::move(param_sizes)),
        config(cfg),
        dev(std::move(context)),
        table(shardopt::default_hyperparams(cfg.algorithm)),
        shard(*dev, config, table),
        reducer(*dev, config, table, shard),
        sync(*dev, config, table, shard),
        step(*dev, config, table, shard, sync) {
    std::vector<shardopt::ParamGroupSpec> specs(1);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      initial.push_back(seeded_values(static_cast<uint32_t>(10 + i), sizes[i]));
      shardopt::ParamSpec p;
      p.name = "p" + std::to_string(i);
      p.param = shardopt::TensorRef{initial.back().data(), sizes[i], shardopt::DType::f32, shardopt::Device::cpu()};
      specs[0].params.push_back(p);
    }
    shardopt::optim::Registration added = table.prepare(specs, config, shardopt::Device::cpu(), "test", dev->rank());
    std::vector<const void*> values = added.initial_values;
    table.append(std::move(added));
    shard.rebuild(values, 0);
    reducer.reset();
  }

  // Parameter i's gradient at step s: the same on every rank.
  std::vector<float> seeded_grad(int s, std::size_t i) const {
    return seeded_values(static_cast<uint32_t>(1000 + 97 * s + static_cast<int>(i)), sizes[i]);
  }

  // Every parameter's values, in registration order.
  std::vector<float> params() const {
    std::vector<float> out;
    for (std::size_t i = 0; i < table.size(); ++i) {
      const float* p = static_cast<const float*>(shard.param_ptr(i));
      out.insert(out.end(), p, p + sizes[i]);
    }
    return out;
  }

  std::vector<int64_t> sizes;
  shardopt::OptimizerConfig config;
  std::unique_ptr<shardopt::optim::DeviceContext> dev;
  shardopt::optim::ParamTable table;
  shardopt::optim::ShardState shard;
  shardopt::optim::GradReducer reducer;
  shardopt::optim::ParamSync sync;
  shardopt::optim::Step step;
  std::vector<std::vector<float>> initial;
};

}  // namespace shardopt_test
