// tests/mpi/test_muon_checkpoint.cpp — Muon's momentum in sharded checkpoints (saved at N ranks, loaded at every smaller world, continuing bitwise) and in torch-format state dicts.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "muon_adamw_model.hpp"

using namespace shardopt;
using shardopt_test::bitwise_equal;
using shardopt_test::Model;
using shardopt_test::train;
using shardopt_test::world;

namespace {

std::string scratch(const std::string& name) {
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/" + name;
  if (world()->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  world()->barrier();
  return dir;
}

// Loads `dir` (saved after step 2) at every world size from 1 to N at once (the ranks below k
// at world k, the others at world N - k: each split group loads the same files), trains steps 2
// and 3, and requires `expected`.
void resume_at_every_world(const std::string& dir, const OptimizerConfig& config, const std::vector<float>& expected) {
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
      resume_at_every_world(dir, config, expected);
    }
  }
}

TEST_CASE("a Muon + AdamW optimizer keeps momentum_buffer over its matrices only, exp_avg and exp_avg_sq over its "
          "vectors only",
          "[muon][memory]") {
  for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
    CAPTURE(partition_name(partition));
    OptimizerConfig config;
    config.partition = partition;
    Model model;
    ZeroOptimizer opt(world(), model.groups(), config);
    const MemoryReport r = opt.memory_report();
    if (partition == PartitionStrategy::flat && world()->size() == 1) {
      // 189 matrix elements at 4 bytes, 59 vector elements at 8: not 12 bytes over the shard.
      CHECK(r.state_bytes == 4 * 189 + 8 * 59);
      continue;
    }
    if (partition == PartitionStrategy::flat) continue;  // vectors split by offset: checked at one rank
    // Whole params per rank: the rank's matrices hold 4 bytes an element and its vectors 8; a
    // kind that every param of the shard keeps spans the shard (its padding too).
    int64_t matrices = 0;
    int64_t vectors = 0;
    for (std::size_t i = 0; i < model.names.size(); ++i) {
      const ParamId id = opt.find_param(model.names[i]);
      if (opt.param_owner(id) != world()->rank()) continue;
      (model.shapes[i].size() == 2 ? matrices : vectors) += opt.param_view(id).numel;
    }
    const int64_t expected = matrices > 0 && vectors > 0 ? 4 * matrices + 8 * vectors
                             : matrices > 0             ? 4 * r.shard_numel
                             : vectors > 0              ? 8 * r.shard_numel
                                                        : 12 * r.shard_numel;
    CHECK(r.state_bytes == expected);
  }
}

TEST_CASE("a Muon + AdamW save says it places moments by algorithm (shard format 3)", "[muon][checkpoint]") {
  OptimizerConfig config;
  const std::string dir = scratch("muon_format3");
  Model model;
  ZeroOptimizer opt(world(), model.groups(), config);
  train(opt, 0, 1);
  opt.save(dir);
  if (world()->rank() != 0) return;
  std::ifstream in(dir + "/manifest.json");
  const std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(manifest.find("\"moment_placement\": \"by_algorithm\"") != std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream file(entry.path(), std::ios::binary);
    std::string head(4096, '\0');
    file.read(head.data(), static_cast<std::streamsize>(head.size()));
    CHECK(head.find("\"format_version\":\"3\"") != std::string::npos);
  }
}

// tests/data/checkpoints/muon_adamw_format1_np2: Model trained 2 steps at 2 ranks (stage 1,
// flat partition, bucket_bytes 128) and saved by shardopt before moments were placed by
// algorithm: every moment kind over every param of each shard (shard format 1).
TEST_CASE("a Muon + AdamW checkpoint of shard format 1 loads at every world size, directly and resharded, and "
          "continues bitwise",
          "[muon][checkpoint]") {
  const std::string fixture = std::string(SHARDOPT_TEST_DATA_DIR) + "/checkpoints/muon_adamw_format1_np2";
  OptimizerConfig config;
  config.stage = 1;
  config.partition = PartitionStrategy::flat;
  config.bucket_bytes = 128;
  Model reference_model;
  ZeroOptimizer reference(world(), reference_model.groups(), config);
  train(reference, 0, 4);
  const std::vector<float> expected = shardopt_test::all_params(reference);
  // Resharded to 3 files: written in shard format 3.
  const std::string resharded = scratch("muon_format1_resharded");
  if (world()->rank() == 0) {
    ReshardOptions options;
    options.world_size = 3;
    reshard_checkpoint(fixture, resharded, options);
  }
  world()->barrier();
  for (const std::string& dir : {fixture, resharded}) {
    CAPTURE(dir);
    resume_at_every_world(dir, config, expected);
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
