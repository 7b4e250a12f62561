// tests/mpi/test_muon_checkpoint.cpp — Muon's momentum in sharded checkpoints (saved at N ranks, loaded at every smaller world, continuing bitwise) and in torch-format state dicts.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::bitwise_equal;
using shardopt_test::world;

namespace {

// Multiples of 2^-12 below 1: sums over up to 4 ranks are exact, so every world size averages
// the ranks' identical gradients to that gradient.
std::vector<float> exact_values(uint32_t seed, int64_t n) {
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

void train(ZeroOptimizer& opt, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    shardopt_test::hand_gradients_backward(opt, opt.config().stage, [&](ParamId id) {
      return exact_values(900u + static_cast<uint32_t>(id * 31 + s), opt.param_view(id).numel);
    });
    opt.reduce_gradients();
    opt.step();
  }
}

std::string scratch(const std::string& name) {
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/" + name;
  if (world()->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world()->barrier();
  return dir;
}

}  // namespace

TEST_CASE("a Muon + AdamW checkpoint saved at N ranks loads at every world size and continues bitwise",
          "[muon][checkpoint]") {
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      CAPTURE(stage, partition_name(partition));
      OptimizerConfig config;
      config.stage = stage;
      config.partition = partition;
      config.bucket_bytes = 128;
      const std::string dir = scratch(std::string("muon_") + partition_name(partition) + std::to_string(stage));
      Model model;
      ZeroOptimizer saved(world(), model.groups(), config);
      train(saved, 0, 2);
      saved.save(dir);
      train(saved, 2, 2);
      const std::vector<float> expected = shardopt_test::all_params(saved);
      // Every world size from 1 to N at once: the ranks below k load at world k, the others at
      // world N - k (each split group loads the same files).
      for (int k = 1; k <= world()->size(); ++k) {
        const bool low = world()->rank() < k;
        auto sub = world()->split(low ? 0 : 1, world()->rank());
        CAPTURE(k, sub->size());
        Model fresh;
        ZeroOptimizer resumed(sub, fresh.groups(), config);
        resumed.load(dir);
        REQUIRE(resumed.param_step(resumed.find_param("w0")) == 2);
        train(resumed, 2, 2);
        REQUIRE(bitwise_equal(shardopt_test::all_params(resumed), expected));
      }
    }
  }
}

TEST_CASE("Muon's consolidated state dict holds torch's momentum_buffer, and loads back bitwise", "[muon][state_dict]") {
  OptimizerConfig config;
  config.stage = 2;
  Model model;
  ZeroOptimizer opt(world(), model.groups(), config);
  train(opt, 0, 3);
  opt.consolidate_state_dict(0);
  train(opt, 3, 2);
  const std::vector<float> expected = shardopt_test::all_params(opt);
  const auto solo = world()->split(world()->rank(), 0);  // collective: before the other ranks leave
  if (world()->rank() != 0) return;
  const StateDict dict = opt.state_dict();
  REQUIRE(dict.param_groups.size() == 2);
  REQUIRE(dict.param_groups[1].settings.algorithm == Algorithm::muon);
  REQUIRE(dict.param_groups[0].settings.algorithm == Algorithm::adamw);
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const ParamState& s = dict.state.at(id);
    CAPTURE(opt.param_name(id));
    if (opt.group_algorithm(opt.param_group(id)) == Algorithm::muon) {
      REQUIRE(s.tensors.size() == 1);  // torch.optim.Muon's state: momentum_buffer only
      REQUIRE(s.tensors.count("momentum_buffer") == 1);
    } else {
      REQUIRE(s.tensors.count("exp_avg") == 1);
      REQUIRE(s.tensors.count("momentum_buffer") == 0);
    }
  }
  // Into a fresh one-rank optimizer: it continues as the N-rank one did.
  Model fresh;
  ZeroOptimizer resumed(solo, fresh.groups(), config);
  // The dict's state is of step 3; the parameters are the caller's to restore (as torch's).
  Model again;
  ZeroOptimizer replay(solo, again.groups(), config);
  train(replay, 0, 3);
  for (ParamId id = 0; id < resumed.num_params(); ++id) {
    const TensorRef from = replay.param_view(id);
    std::copy(from.as<float>(), from.as<float>() + from.numel, resumed.param_view(id).as<float>());
  }
  resumed.load_state_dict(dict);
  train(resumed, 3, 2);
  REQUIRE(bitwise_equal(shardopt_test::all_params(resumed), expected));
}
