// tests/checkpoint/test_save_proof.cpp — a save commits only what rank 0 has proven: unshared directories, damaged files and unloadable hyperparameters fail on every rank, the previous checkpoint intact.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt_models.hpp"
#include "ckpt_test_support.hpp"
#include "shardopt/checkpoint.hpp"

using namespace shardopt;
using namespace shardopt_test;
namespace fs = std::filesystem;

namespace {

// Runs the enclosing scope in `dir` as the working directory, then returns to the previous one.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const std::string& dir) : previous_(fs::current_path()) { fs::current_path(dir); }
  ~WorkingDirectory() { fs::current_path(previous_); }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;

 private:
  fs::path previous_;
};

// What a refused save must leave: rank 0's view of `dir` byte for byte as before (manifest and
// shard files), verifying, and loading into a fresh optimizer as the state `at_save`.
void expect_previous_checkpoint(const std::string& dir, const OptimizerConfig& config, const std::string& manifest,
                                const std::vector<std::string>& files, const std::vector<float>& at_save,
                                const std::vector<int64_t>& steps) {
  if (world()->rank() == 0) {
    REQUIRE(file_bytes(dir + "/manifest.json") == manifest);
    REQUIRE(shard_files(dir) == files);
    verify_checkpoint(dir);
  }
  Model fresh_model(kSizes, 77);
  auto fresh = make_optimizer(world(), config, fresh_model);
  fresh->load(dir);
  REQUIRE(bitwise_equal(all_params(*fresh), at_save));
  REQUIRE(all_steps(*fresh) == steps);
}

std::vector<OptimizerConfig> sharded_and_replicated() {
  OptimizerConfig sharded;
  OptimizerConfig replicated;
  replicated.shard_state = false;
  return {sharded, replicated};
}

}  // namespace

TEST_CASE("a save to per-rank directories that are not shared fails on every rank, the previous checkpoint intact",
          "[checkpoint][save_proof]") {
  const int n = world()->size(), me = world()->rank();
  for (const OptimizerConfig& config : sharded_and_replicated()) {
    CAPTURE(config.shard_state);
    const std::string base = scratch("unshared");
    const std::string own = base + "/rank" + std::to_string(me);
    fs::create_directories(own);
    world()->barrier();
    // The previous checkpoint: saved by every rank to one absolute path, rank 0's directory.
    const std::string previous = base + "/rank0/ckpt";
    Model model(kSizes, 5);
    auto opt = make_optimizer(world(), config, model);
    train(*opt, 0, 2);
    opt->save(previous);
    const std::vector<float> at_save = all_params(*opt);
    const std::vector<int64_t> steps = all_steps(*opt);
    const std::string manifest = me == 0 ? file_bytes(previous + "/manifest.json") : "";
    const std::vector<std::string> files = me == 0 ? shard_files(previous) : std::vector<std::string>{};
    train(*opt, 2, 4);

    // Every rank saves to "ckpt" from its own working directory: rank r writes base/rank<r>/ckpt,
    // which is rank 0's previous checkpoint for rank 0 only.
    if (n == 1) {
      WorkingDirectory cwd(own);
      opt->save("ckpt");  // one rank: its directory is the checkpoint, and the save is good
      continue;
    }
    std::pair<ErrorCode, std::string> refused;
    {
      WorkingDirectory cwd(own);
      refused = error_of([&] { opt->save("ckpt"); });
    }
    const auto& [code, message] = refused;
    CAPTURE(message);
    REQUIRE(code == ErrorCode::io);
    REQUIRE(message.find("save to 'ckpt'") != std::string::npos);
    REQUIRE(message.find("the ranks do not share the checkpoint directory") != std::string::npos);
    REQUIRE(message.find("nothing was committed, the previous checkpoint is unchanged") != std::string::npos);
    // Each rank that misses a file says so from its own view (the agreement gives a failing
    // rank its own error, the others the lowest failing rank's).
    const std::string rank0_file = fmt::format("-00000-of-{:05d}.safetensors'", config.shard_state ? n : 1);
    if (config.shard_state && me == 0) {
      REQUIRE(message.find(fmt::format("rank 1 wrote 'shard-")) != std::string::npos);
      REQUIRE(message.find(fmt::format("-00001-of-{:05d}.safetensors' but rank 0 cannot find it", n)) != std::string::npos);
      REQUIRE(message.find("as seen from '" + fs::canonical(previous).string() + "'") != std::string::npos);
    } else if (me == 0) {
      // Rank 0 sees its one file; rank 1, the first that cannot, is named.
      REQUIRE(message.find("save failed on rank 1: save to 'ckpt'") != std::string::npos);
      REQUIRE(message.find(rank0_file + " but rank 1 cannot find it") != std::string::npos);
    } else {
      REQUIRE(message.find(rank0_file + fmt::format(" but rank {} cannot find it", me)) != std::string::npos);
      REQUIRE(message.find("as seen from '" + fs::canonical(own).string() + "/ckpt'") != std::string::npos);
      // This rank's own directory held only this save's file: both are gone again.
      REQUIRE(!fs::exists(own + "/ckpt"));
    }
    world()->barrier();
    expect_previous_checkpoint(previous, config, manifest, files, at_save, steps);
    world()->barrier();
  }
}

TEST_CASE("a shard file damaged after it was written is caught before the manifest is committed",
          "[checkpoint][save_proof]") {
  const int n = world()->size();
  const std::string dir = scratch("damaged_after_write");
  for (const OptimizerConfig& config : sharded_and_replicated()) {
    CAPTURE(config.shard_state);
    Model model(kSizes, 9);
    auto opt = make_optimizer(world(), config, model);
    train(*opt, 0, 2);
    opt->save(dir);
    const std::vector<float> at_save = all_params(*opt);
    const std::vector<int64_t> steps = all_steps(*opt);
    const std::string manifest = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
    const std::vector<std::string> files = world()->rank() == 0 ? shard_files(dir) : std::vector<std::string>{};
    train(*opt, 2, 3);

    // The last writer flips a byte of its file after reporting its CRC32C.
    const int victim = config.shard_state ? n - 1 : 0;
    const int count = config.shard_state ? n : 1;
    ::setenv("SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK", std::to_string(victim).c_str(), 1);
    auto [code, message] = error_of([&] { opt->save(dir); });
    ::unsetenv("SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK");
    CAPTURE(message);
    REQUIRE(code == ErrorCode::corrupt);
    REQUIRE(message.find("CRC32C") != std::string::npos);
    REQUIRE(message.find(fmt::format("-{:05d}-of-{:05d}.safetensors", victim, count)) != std::string::npos);
    world()->barrier();
    expect_previous_checkpoint(dir, config, manifest, files, at_save, steps);
    world()->barrier();
  }
}

TEST_CASE("a damaged shard file is found by the rank that wrote it, and the save fails on every rank naming it",
          "[checkpoint][save_proof]") {
  // Each rank reads back only its own file: rank 1's damage is rank 1's finding, which the
  // agreement hands to every rank (rank 0 no longer reads every file).
  const int n = world()->size(), me = world()->rank();
  const std::string dir = scratch("damaged_found_by_writer");
  OptimizerConfig config;
  Model model(kSizes, 21);
  auto opt = make_optimizer(world(), config, model);
  train(*opt, 0, 2);
  opt->save(dir);
  const std::vector<float> at_save = all_params(*opt);
  const std::vector<int64_t> steps = all_steps(*opt);
  const std::string manifest = me == 0 ? file_bytes(dir + "/manifest.json") : "";
  const std::vector<std::string> files = me == 0 ? shard_files(dir) : std::vector<std::string>{};
  train(*opt, 2, 3);

  const int victim = n > 1 ? 1 : 0;
  ::setenv("SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK", std::to_string(victim).c_str(), 1);
  auto [code, message] = error_of([&] { opt->save(dir); });
  ::unsetenv("SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK");
  CAPTURE(message);
  REQUIRE(code == ErrorCode::corrupt);
  const std::string damaged = fmt::format("-{:05d}-of-{:05d}.safetensors' is corrupt: CRC32C", victim, n);
  REQUIRE(message.find(damaged) != std::string::npos);
  const std::string finding = fmt::format("save to '{}': checkpoint '{}': shard file '", dir, dir);
  if (me == victim) {
    REQUIRE(message.rfind(finding, 0) == 0);
  } else {
    REQUIRE(message.rfind(fmt::format("save failed on rank {}: {}", victim, finding), 0) == 0);
  }
  world()->barrier();
  expect_previous_checkpoint(dir, config, manifest, files, at_save, steps);
  world()->barrier();
}

TEST_CASE("a save refuses hyperparameters that no load would accept, before writing anything", "[checkpoint][save_proof]") {
  const std::string dir = scratch("bad_hyper");
  OptimizerConfig config;
  Model model(kSizes, 13);
  auto opt = make_optimizer(world(), config, model);
  train(*opt, 0, 2);
  opt->save(dir);
  const std::vector<float> at_save = all_params(*opt);
  const std::vector<int64_t> steps = all_steps(*opt);
  const std::string manifest = world()->rank() == 0 ? file_bytes(dir + "/manifest.json") : "";
  const std::vector<std::string> files = world()->rank() == 0 ? shard_files(dir) : std::vector<std::string>{};
  opt->hyperparams(1).lr = -1.0;  // no step since: nothing has refused it yet
  auto [code, message] = error_of([&] { opt->save(dir); });
  CAPTURE(message);
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE(message.find("param group 1: invalid lr -1") != std::string::npos);
  world()->barrier();
  expect_previous_checkpoint(dir, config, manifest, files, at_save, steps);
  world()->barrier();
}
