// tests/parity/parity_optimizer_test.cpp — ZeroOptimizer at this world size replayed over torch.optim's golden trajectories.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "golden_data.hpp"
#include "mpi/mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace {

using namespace shardopt;
using shardopt_parity::Comparison;
using shardopt_parity::GoldenCase;

struct Run {
  Comparison cmp;
  std::string problems;  // API contract violations seen on the way (wrong step count, views)
};

// A view's data for reading/writing `numel` floats. Throwing (rather than a Catch REQUIRE) keeps
// the ranks in lockstep: every rank sees the same layout, so every rank throws at the same call.
float* floats_of(const TensorRef& view, std::size_t numel, const std::string& what) {
  if (view.data == nullptr || view.numel != static_cast<int64_t>(numel) || view.dtype != DType::f32) {
    throw std::runtime_error(fmt::format("{}: view has {} elements (data {}), expected {} f32", what,
                                         view.numel, view.data == nullptr ? "null" : "set", numel));
  }
  return view.as<float>();
}

// Feeds the golden gradients to ZeroOptimizer (identical on every rank, so no reduce_gradients),
// applies each step's hyperparameters as a scheduler would, and compares every param after every
// step on this rank.
Run replay(const GoldenCase& c, PartitionStrategy partition, Storage storage) {
  const bool external = storage == Storage::external;
  OptimizerConfig config;
  config.algorithm = c.algorithm;
  config.partition = partition;
  config.storage = storage;

  // external: the trainer's own param and grad buffers. bucket_view: the initial values only.
  std::vector<std::vector<float>> params(c.params.size()), grads(c.params.size());
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
  ZeroOptimizer opt(shardopt_test::world(), config, std::move(groups));

  std::vector<ParamId> ids;
  for (const auto& p : c.params) ids.push_back(opt.find_param(p.name));

  Run run;
  for (int k = 0; k < c.steps; ++k) {
    const std::size_t step = static_cast<std::size_t>(k);
    for (int g = 0; g < static_cast<int>(c.groups.size()); ++g) {
      opt.hyperparams(g) = c.groups[static_cast<std::size_t>(g)].hyper_per_step[step];
    }
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::vector<float>& g = c.grads[step][i];
      float* dst = external ? grads[i].data()
                            : floats_of(opt.grad_view(ids[i]), g.size(), "grad_view(" + c.params[i].name + ")");
      std::copy(g.begin(), g.end(), dst);
    }
    opt.step();
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::string& name = c.params[i].name;
      const float* now = external ? params[i].data()
                                  : floats_of(opt.param_view(ids[i]), params[i].size(), "param_view(" + name + ")");
      run.cmp.add(fmt::format("step {} {}", k + 1, name), now, c.expected[step][i]);
      if (opt.param_step(ids[i]) != k + 1) {
        run.problems += fmt::format("  after step {}: param_step({}) = {}\n", k + 1, name, opt.param_step(ids[i]));
      }
      if (external && opt.param_view(ids[i]).data != params[i].data()) {
        run.problems += fmt::format("  external storage: param_view({}) is not the caller's buffer\n", name);
      }
    }
  }
  return run;
}

}  // namespace

TEST_CASE("ZeroOptimizer reproduces torch.optim's golden trajectories", "[parity][optimizer]") {
  const std::string dir = shardopt_parity::golden_dir();
  const int world_size = shardopt_test::world()->size();
  const int rank = shardopt_test::world()->rank();
  INFO("golden data: " << dir << ", rank " << rank << " of " << world_size);
  const std::vector<GoldenCase> cases = shardopt_parity::load_golden_cases(dir);
  REQUIRE(!cases.empty());
  const char* verbose_env = std::getenv("SHARDOPT_PARITY_VERBOSE");
  const bool verbose = verbose_env != nullptr && verbose_env[0] != '\0' && verbose_env[0] != '0' && rank == 0;

  for (const GoldenCase& c : cases) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (Storage storage : {Storage::external, Storage::bucket_view}) {
        const std::string label = fmt::format("{} [{}, {}, np {}]", c.name, partition_name(partition),
                                              storage == Storage::external ? "external" : "bucket_view",
                                              world_size);
        Run run;
        try {
          run = replay(c, partition, storage);
        } catch (const std::exception& e) {
          // Deterministic on every rank (same data, same layout); record it and go on, so one
          // broken case does not hide the others.
          FAIL_CHECK(label << ": " << e.what());
          continue;
        }
        INFO(label << " (" << c.file << "): " << run.cmp.summary() << "\n" << run.cmp.failures << run.problems);
        CHECK(run.cmp.out_of_tolerance == 0);
        CHECK(run.problems.empty());
        if (verbose) std::printf("[optimizer] %-50s %s\n", label.c_str(), run.cmp.summary().c_str());
      }
    }
  }
}
