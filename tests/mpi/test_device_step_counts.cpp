// tests/mpi/test_device_step_counts.cpp — the optimizer's device path on a counting host DeviceOps: bitwise the CPU path's results, and after the first step no allocation, no stream or event creation and no host synchronisation the caller did not ask for.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "host_device_ops.hpp"
#include "mpi_test_support.hpp"
#include "wired_optimizer_parts.hpp"

namespace {

using namespace shardopt;
using shardopt_test::DeviceCallCounts;
using shardopt_test::HostDeviceOps;
using shardopt_test::StreamReportingComm;

const std::vector<int64_t> kSizes = {1000, 37, 515, 2048, 3};

// The optimizer's parts wired as ZeroOptimizer wires them, over a given DeviceContext.
struct Parts : shardopt_test::WiredOptimizerParts {
  Parts(std::unique_ptr<optim::DeviceContext> context, const OptimizerConfig& cfg)
      : WiredOptimizerParts(std::move(context), cfg, kSizes) {}

  // One training step with seeded gradients (the same on every rank); `clip` asks for the norm
  // first, as clip_grad_norm() does.
  void train_step(int s, bool clip) {
    for (std::size_t i = 0; i < table.size(); ++i) {
      const std::vector<float> g = seeded_grad(s, i);
      if (shard.stage2()) {
        // As a backward hook would: each gradient handed as soon as it is ready.
        reducer.hand(static_cast<ParamId>(i), TensorRef{const_cast<float*>(g.data()), kSizes[i], DType::f32,
                                                        Device::cpu()});
      } else {
        dev->copy_bytes(shard.grad_ptr(i), g.data(), g.size() * sizeof(float));
      }
    }
    reducer.reduce_all();
    if (clip) {
      const kernels::GradStats mine = step.local_grad_stats(false);
      std::vector<kernels::GradStats> parts(static_cast<std::size_t>(dev->world()));
      for (int r = 0; r < dev->world(); ++r) {
        // Every rank's shard stats, in rank order: gathered through the host communicator.
        double record[2] = {mine.value, mine.nonfinite ? 1.0 : 0.0};
        dev->host_comm().broadcast(record, 2 * 2, DType::f32, r);  // doubles moved as float pairs
        parts[static_cast<std::size_t>(r)] = kernels::GradStats{record[0], record[1] != 0.0};
      }
      step.arm_clip(1.0, false, parts);
    }
    step.run(false, 0.0);
  }
};

OptimizerConfig config_for(int64_t pipeline_chunk_bytes, int stage) {
  OptimizerConfig config;
  config.stage = stage;
  config.algorithm = Algorithm::adamw;
  config.bucket_bytes = 1024 * 4;  // several buckets and several chunks over these sizes
  config.pipeline_chunk_bytes = pipeline_chunk_bytes;
  return config;
}

void check_device_path(int64_t pipeline_chunk_bytes, bool clip, int stage = 1) {
  std::shared_ptr<Communicator> world = shardopt_test::world();
  const OptimizerConfig config = config_for(pipeline_chunk_bytes, stage);
  Parts plain(std::make_unique<optim::DeviceContext>(world), config);
  DeviceCallCounts counts;
  auto comm = std::make_shared<StreamReportingComm>(world);
  Parts device(std::make_unique<optim::DeviceContext>(std::make_shared<Communicator>(comm),
                                                      std::make_unique<HostDeviceOps>(&counts)),
               config);
  REQUIRE(device.dev->on_device());
  REQUIRE(device.dev->stream_ordered());
  REQUIRE(counts.streams_created == 1);  // the compute stream
  REQUIRE(counts.events_created == 2);   // compute-ready and comm-done, for the optimizer's life

  constexpr int kSteps = 4;
  DeviceCallCounts after_first;
  int64_t groups_after_first = 0;
  int64_t waits_after_first = 0;
  for (int s = 0; s < kSteps; ++s) {
    plain.train_step(s, clip);
    device.train_step(s, clip);
    REQUIRE(shardopt_test::bitwise_equal(device.params(), plain.params()));
    if (s == 0) {
      after_first = counts;
      groups_after_first = comm->groups();
      waits_after_first = comm->host_waits();
    }
  }
  const int steps = kSteps - 1;
  // Nothing allocated, created or waited for by the host after the first step, except the one
  // synchronisation per clip_grad_norm (the caller asked for the norm on the host).
  CHECK(counts.allocations == after_first.allocations);
  CHECK(counts.streams_created == 1);
  CHECK(counts.events_created == 2);
  CHECK(counts.synchronizations - after_first.synchronizations == (clip ? steps : 0));
  CHECK(counts.launches > after_first.launches);
  // Nor did the host wait for any collective (the device orders the reductions and the sync),
  // except inside the norm's synchronisation: it first waits, within the communicator's
  // timeout, for the last collective the compute stream depends on (the gradient reduction).
  CHECK(comm->host_waits() - waits_after_first == (clip && world->size() > 1 ? steps : 0));

  if (stage == 2) return;  // the reduction's events follow the hand-over order; counted above for stage 1

  // The ordering is on the device: each collective round is preceded by the compute stream's
  // event and followed by the communication stream's, exactly as many as the layout needs.
  const int world_size = world->size();
  const partition::Layout& layout = device.shard.layout();
  int64_t largest = 0;
  for (const partition::RankShard& shard : layout.shards) largest = std::max(largest, shard.numel);
  const int64_t bucket = optim::bucket_elements(config, DType::f32);
  // Stage 1: one settle before the all-reduces, one finish after them.
  const int64_t reduce_rounds = world_size > 1 ? 2 : 0;
  int64_t sync_records = 0;
  int64_t sync_groups = 0;
  if (world_size > 1) {
    if (pipeline_chunk_bytes > 0) {
      const int64_t chunk = pipeline_chunk_bytes / 4 / optim::kShardAlignment * optim::kShardAlignment;
      sync_groups = (largest + chunk - 1) / chunk;
      sync_records = sync_groups + 1;  // one settle per chunk, one finish
    } else {
      sync_groups = (largest + bucket - 1) / bucket;
      sync_records = 2;  // one settle, one finish
    }
  }
  const int64_t per_step = reduce_rounds + sync_records;
  CHECK(counts.events_recorded - after_first.events_recorded == steps * per_step);
  CHECK(counts.event_waits - after_first.event_waits == steps * per_step);
  CHECK(comm->groups() - groups_after_first == steps * sync_groups);
}

TEST_CASE("device path: no per-step allocation or host sync, bitwise the CPU path", "[device][step]") {
  SECTION("plain sync") { check_device_path(0, false); }
  SECTION("pipelined sync, two chunks in flight") { check_device_path(1024, false); }
  SECTION("pipelined sync with clipping: one host sync per norm") { check_device_path(1024, true); }
  SECTION("stage 2: reduce_gradient per parameter, no host sync") { check_device_path(1024, false, 2); }
}

}  // namespace
