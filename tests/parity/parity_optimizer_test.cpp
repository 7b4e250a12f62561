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
#include "golden_replay.hpp"
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

// Feeds the golden gradients to ZeroOptimizer (identical on every rank, so no reduce_gradients),
// applies each step's hyperparameters as a scheduler would, and compares every param after every
// step on this rank.
Run replay(const GoldenCase& c, PartitionStrategy partition, Storage storage) {
  shardopt_parity::GoldenReplay replay(c, partition, storage);
  ZeroOptimizer& opt = *replay.opt;
  const std::vector<ParamId>& ids = replay.ids;
  const bool external = replay.external;

  Run run;
  for (int k = 0; k < c.steps; ++k) {
    const std::size_t step = static_cast<std::size_t>(k);
    for (int g = 0; g < static_cast<int>(c.groups.size()); ++g) {
      opt.hyperparams(g) = c.groups[static_cast<std::size_t>(g)].hyper_per_step[step];
    }
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::vector<float>& g = c.grads[step][i];
      std::copy(g.begin(), g.end(), replay.grad(i, g.size(), c.params[i].name));
    }
    opt.step();
    for (std::size_t i = 0; i < c.params.size(); ++i) {
      const std::string& name = c.params[i].name;
      const float* now = replay.param(i, name);
      run.cmp.add(fmt::format("step {} {}", k + 1, name), now, c.expected[step][i]);
      if (opt.param_step(ids[i]) != k + 1) {
        run.problems += fmt::format("  after step {}: param_step({}) = {}\n", k + 1, name, opt.param_step(ids[i]));
      }
      if (external && opt.param_view(ids[i]).data != replay.params[i].data()) {
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
