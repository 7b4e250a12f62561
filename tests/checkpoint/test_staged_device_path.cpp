// tests/checkpoint/test_staged_device_path.cpp — save, load and consolidation of an optimizer on the device path (a counting host DeviceOps): the CPU path's bytes, through the staging engine.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/optimizer_parts.hpp"
#include "ckpt_test_support.hpp"
#include "host_device_ops.hpp"
#include "wired_optimizer_parts.hpp"

namespace {

using namespace shardopt;
using shardopt_test::DeviceCallCounts;
using shardopt_test::HostDeviceOps;
using shardopt_test::StreamReportingComm;

const std::vector<int64_t> kSizes = {1000, 37, 0, 515, 2048, 3};

// The optimizer's parts wired as ZeroOptimizer wires them, over a given DeviceContext, and
// the checkpoint's view of them.
struct Parts : shardopt_test::WiredOptimizerParts {
  Parts(std::unique_ptr<optim::DeviceContext> context, const OptimizerConfig& cfg)
      : WiredOptimizerParts(std::move(context), cfg, kSizes) {}
  void train(int from, int to) {
    for (int s = from; s < to; ++s) {
      for (std::size_t i = 0; i < table.size(); ++i) {
        const std::vector<float> g = seeded_grad(s, i);
        dev->copy_bytes(shard.grad_ptr(i), g.data(), g.size() * sizeof(float));
      }
      reducer.reduce_all();
      step.run(false, 0.0);
    }
  }
  checkpoint::OptimizerParts parts() { return checkpoint::OptimizerParts{config, *dev, table, shard, step, staging}; }

  checkpoint::StagingSettings staging;
};

std::unique_ptr<Parts> device_parts(const OptimizerConfig& config, DeviceCallCounts& counts) {
  auto comm = std::make_shared<Communicator>(std::make_shared<StreamReportingComm>(shardopt_test::world()));
  return std::make_unique<Parts>(std::make_unique<optim::DeviceContext>(comm, std::make_unique<HostDeviceOps>(&counts)),
                                 config);
}

std::string data_section(const std::string& path) {
  const std::string bytes = shardopt_test::file_bytes(path);
  uint64_t header = 0;
  REQUIRE(bytes.size() >= 8);
  std::memcpy(&header, bytes.data(), 8);
  REQUIRE(bytes.size() >= 8 + header);
  return bytes.substr(8 + header);
}

}  // namespace

TEST_CASE("the device path saves, loads and consolidates the CPU path's bytes through staging", "[staging][device]") {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.bucket_bytes = 1024 * 4;
  const std::string cpu_dir = shardopt_test::scratch("device_path_cpu");
  const std::string device_dir = shardopt_test::scratch("device_path_device");
  Parts cpu(std::make_unique<optim::DeviceContext>(shardopt_test::world()), config);
  DeviceCallCounts counts;
  auto device = device_parts(config, counts);
  REQUIRE(device->dev->on_device());
  cpu.train(0, 3);
  device->train(0, 3);
  REQUIRE(shardopt_test::bitwise_equal(device->params(), cpu.params()));

  // A device save stages even without a forced slot size (default slots here).
  device->staging.stats = std::make_shared<checkpoint::CopyStats>();
  const int64_t syncs_before = counts.synchronizations;
  checkpoint::save_checkpoint(cpu.parts(), cpu_dir);
  checkpoint::save_checkpoint(device->parts(), device_dir);
  REQUIRE(device->staging.stats->engines == 1);
  REQUIRE(device->staging.stats->staging_bytes == 2 * static_cast<int64_t>(checkpoint::kDefaultStagingBytes));
  REQUIRE(device->staging.stats->to_host_calls > 0);
  REQUIRE(counts.synchronizations > syncs_before);  // the host waited for the device before staging
  shardopt_test::world()->barrier();
  if (shardopt_test::world()->rank() == 0) {
    const auto a = shardopt_test::shard_files(cpu_dir), b = shardopt_test::shard_files(device_dir);
    REQUIRE(a.size() == b.size());
    for (std::size_t f = 0; f < a.size(); ++f) {
      REQUIRE(data_section(cpu_dir + "/" + a[f]) == data_section(device_dir + "/" + b[f]));
    }
  }
  shardopt_test::world()->barrier();

  // Loaded on the device path with slots that split every tensor: the CPU's values and training.
  DeviceCallCounts load_counts;
  auto loaded = device_parts(config, load_counts);
  loaded->staging.slot_bytes = 4099;
  loaded->staging.stats = std::make_shared<checkpoint::CopyStats>();
  checkpoint::load_checkpoint(loaded->parts(), cpu_dir);
  loaded->reducer.reset();
  loaded->sync.sync();
  REQUIRE(loaded->staging.stats->max_call_bytes <= 4099);
  if (loaded->shard.own_shard().numel > 0) REQUIRE(loaded->staging.stats->to_device_calls > 0);
  REQUIRE(shardopt_test::bitwise_equal(loaded->params(), cpu.params()));
  loaded->train(3, 5);
  cpu.train(3, 5);
  REQUIRE(shardopt_test::bitwise_equal(loaded->params(), cpu.params()));

  // Consolidated from the device path in chunks: the CPU path's dict.
  loaded->staging.slot_bytes = 13;
  const int to = shardopt_test::world()->size() - 1;
  const std::optional<StateDict> expected = checkpoint::gather_state_dict(cpu.parts(), to);
  const std::optional<StateDict> got = checkpoint::gather_state_dict(loaded->parts(), to);
  REQUIRE(got.has_value() == (shardopt_test::world()->rank() == to));
  REQUIRE(expected.has_value() == got.has_value());
  if (got) {
    REQUIRE(got->state.size() == expected->state.size());
    for (const auto& [id, s] : expected->state) {
      for (const auto& [kind, values] : s.tensors) {
        REQUIRE(shardopt_test::bitwise_equal(got->state.at(id).tensors.at(kind), values));
      }
    }
  }
}
