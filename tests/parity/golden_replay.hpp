// tests/parity/golden_replay.hpp — a ZeroOptimizer registered from a golden case, with the trainer-side buffers and views the parity tests replay through.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "golden_data.hpp"
#include "mpi/mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_parity {

// A view's data for reading/writing `numel` floats. Throwing (rather than a Catch REQUIRE) keeps
// the ranks in lockstep: every rank sees the same layout, so every rank throws at the same call.
inline float* floats_of(const shardopt::TensorRef& view, std::size_t numel, const std::string& what) {
  if (view.data == nullptr || view.numel != static_cast<int64_t>(numel) || view.dtype != shardopt::DType::f32) {
    throw std::runtime_error(fmt::format("{}: view has {} elements (data {}), expected {} f32", what,
                                         view.numel, view.data == nullptr ? "null" : "set", numel));
  }
  return view.as<float>();
}

// The case's params registered group by group with the first step's hyperparameters, at this
// world size. external: `params`/`grads` are the trainer's own buffers; bucket_view: `params`
// only held the initial values and the optimizer's views are used instead.
struct GoldenReplay {
  std::vector<std::vector<float>> params, grads;
  std::unique_ptr<shardopt::ZeroOptimizer> opt;
  std::vector<shardopt::ParamId> ids;  // by the case's param index
  bool external = false;

  GoldenReplay(const GoldenCase& c, shardopt::PartitionStrategy partition, shardopt::Storage storage)
      : params(c.params.size()), grads(c.params.size()), external(storage == shardopt::Storage::external) {
    using namespace shardopt;
    OptimizerConfig config;
    config.algorithm = c.algorithm;
    config.partition = partition;
    config.storage = storage;
    std::vector<ParamGroupSpec> groups;
    for (const auto& golden_group : c.groups) {
      ParamGroupSpec spec;
      spec.hyper = golden_group.hyper_per_step.front();
      for (int index : golden_group.params) {
        const std::size_t i = static_cast<std::size_t>(index);
        const int64_t numel = static_cast<int64_t>(c.params[i].init.size());
        params[i] = c.params[i].init;
        ParamSpec p;
        p.name = c.params[i].name;
        p.param = TensorRef{params[i].data(), numel, DType::f32, Device::cpu()};
        if (external) {
          grads[i].assign(static_cast<std::size_t>(numel), 0.f);
          p.grad = TensorRef{grads[i].data(), numel, DType::f32, Device::cpu()};
        }
        spec.params.push_back(p);
      }
      groups.push_back(std::move(spec));
    }
    opt = std::make_unique<ZeroOptimizer>(shardopt_test::world(), config, std::move(groups));
    for (const auto& p : c.params) ids.push_back(opt->find_param(p.name));
  }

  // Where param i's gradient is written and its values read, `numel` floats each.
  float* grad(std::size_t i, std::size_t numel, const std::string& name) {
    return external ? grads[i].data() : floats_of(opt->grad_view(ids[i]), numel, "grad_view(" + name + ")");
  }
  float* param(std::size_t i, const std::string& name) {
    return external ? params[i].data() : floats_of(opt->param_view(ids[i]), params[i].size(), "param_view(" + name + ")");
  }
};

}  // namespace shardopt_parity
