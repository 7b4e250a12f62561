// tests/mpi/test_device_overlap.cpp — the overlap engine on the device path (a counting host DeviceOps over a communicator that reports a stream, as NCCL does): bitwise the plain CPU step for both stages, partitions, dtypes and policies, with no host synchronisation, host wait, allocation or event creation after the first round, one gather per bucket, and wait_param as device-side waits only.
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "host_device_ops.hpp"
#include "lazy_stream_comm.hpp"
#include "mpi_test_support.hpp"
#include "optim/device_context.hpp"
#include "optim/grad_reducer.hpp"
#include "optim/overlap.hpp"
#include "optim/param_sync.hpp"
#include "optim/param_table.hpp"
#include "optim/shard_state.hpp"
#include "optim/step.hpp"
#include "precision.hpp"  // kernels/: float <-> bf16 (nearest even)

namespace {

using namespace shardopt;
using shardopt_test::DeviceCallCounts;
using shardopt_test::HostDeviceOps;
using shardopt_test::LazyDeviceOps;
using shardopt_test::LazyStream;
using shardopt_test::LazyStreamComm;
using shardopt_test::StreamReportingComm;

// Several buckets of 64 f32 (128 bf16) elements, some params spanning two.
const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};
constexpr int kSteps = 4;

struct Setup {
  int stage = 1;
  PartitionStrategy partition = PartitionStrategy::flat;
  DType dtype = DType::f32;
  OverlapPolicy overlap = OverlapPolicy::after_backward;
  // Sums divided by world + 1 instead of averaged (as while a rank is in join(), or with
  // divide_by_initial_world_size): the division reads the reduction on the compute stream.
  bool other_divisor = false;
};

std::string describe(const Setup& s) {
  return "stage " + std::to_string(s.stage) + ", " + partition_name(s.partition) + ", " + dtype_name(s.dtype) + ", " +
         overlap_policy_name(s.overlap) + (s.other_divisor ? ", divided by world + 1" : "");
}

OptimizerConfig config_for(const Setup& s, OverlapPolicy overlap) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.partition = s.partition;
  config.stage = s.stage;
  config.bucket_bytes = 256;
  config.overlap = overlap;
  config.stochastic_rounding = s.dtype == DType::bf16;
  config.rounding_seed = 3;
  return config;
}

// This rank's gradient of param i at step `step` in the setup's dtype: different on every rank.
std::vector<uint8_t> grad_of(const Setup& s, int step, std::size_t param) {
  const std::vector<float> values = shardopt_test::seeded_values(
      1000u + static_cast<uint32_t>(shardopt_test::world()->rank() * 97 + step * 13) + static_cast<uint32_t>(param),
      kSizes[param]);
  std::vector<uint8_t> bytes;
  if (s.dtype == DType::f32) {
    bytes.resize(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
  }
  for (float x : values) {
    const uint16_t h = kernels::float_to_bf16(x);
    bytes.push_back(static_cast<uint8_t>(h & 0xff));
    bytes.push_back(static_cast<uint8_t>(h >> 8));
  }
  return bytes;
}

// The optimizer's parts wired as ZeroOptimizer wires them, over a given DeviceContext, with the
// overlap engine last (its queued work reads the buffers before them).
struct Parts {
  Parts(std::unique_ptr<optim::DeviceContext> context, std::shared_ptr<comm::CommThread> thread, const Setup& s,
        OverlapPolicy overlap)
      : setup(s),
        config(config_for(s, overlap)),
        dev(std::move(context)),
        table(default_hyperparams(config.algorithm)),
        shard(*dev, config, table),
        reducer(*dev, config, table, shard),
        sync(*dev, config, table, shard),
        step(*dev, config, table, shard, sync),
        engine(std::move(thread), *dev, config, table, shard, sync, step) {
    std::vector<ParamGroupSpec> specs(1);
    specs[0].hyper = shardopt_test::busy_hyperparams(Algorithm::adamw);
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      const std::vector<float> values = shardopt_test::seeded_values(static_cast<uint32_t>(10 + i), kSizes[i]);
      initial.emplace_back();
      if (s.dtype == DType::f32) {
        initial.back().resize(values.size() * sizeof(float));
        std::memcpy(initial.back().data(), values.data(), initial.back().size());
      } else {
        for (float x : values) {
          const uint16_t h = kernels::float_to_bf16(x);
          initial.back().push_back(static_cast<uint8_t>(h & 0xff));
          initial.back().push_back(static_cast<uint8_t>(h >> 8));
        }
      }
      ParamSpec p;
      p.name = "p" + std::to_string(i);
      p.param = TensorRef{initial.back().data(), kSizes[i], s.dtype, Device::cpu()};
      p.grad = TensorRef{nullptr, kSizes[i], s.dtype, Device::cpu()};
      specs[0].params.push_back(p);
    }
    optim::Registration added = table.prepare(specs, config, Device::cpu(), "test", dev->rank());
    std::vector<const void*> values = added.initial_values;
    table.append(std::move(added));
    shard.rebuild(values, 0);
    reducer.reset();
    engine.reset();
  }

  std::size_t bytes_of(std::size_t param) const { return optim::span_bytes(kSizes[param], setup.dtype); }

  // Gradients in place (stage 1) or handed in backward order (stage 2), reduced, stepped.
  int divisor(int active) const { return setup.other_divisor ? dev->world() + 1 : active; }

  void plain_step(int s) {
    dev->set_gradient_divisor(divisor(dev->world()));
    for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
      const std::size_t k = static_cast<std::size_t>(i);
      std::vector<uint8_t> g = grad_of(setup, s, k);
      if (shard.stage2()) {
        reducer.hand(i, TensorRef{g.data(), kSizes[k], setup.dtype, Device::cpu()});
      } else {
        dev->copy_bytes(shard.grad_ptr(k), g.data(), g.size());
      }
    }
    reducer.reduce_all();
    step.run(false, 0.0);
  }

  // As ZeroOptimizer drives the engine: a round opened by the first hand-over, the gradients
  // handed in backward order (stage 1 alternates grad_ready and reduce_gradient), the order
  // agreed, the round settled, the step.
  void overlapped_step(int s) {
    const comm::Agreed opened = comm::agree_with_joined(dev->host_comm(), comm::AgreementRecord("reduce_gradient"));
    dev->set_gradient_divisor(divisor(opened.active()));
    engine.open_round(opened, /*explicit_hand_over=*/true);
    for (int i = static_cast<int>(kSizes.size()) - 1; i >= 0; --i) {
      const std::size_t k = static_cast<std::size_t>(i);
      std::vector<uint8_t> g = grad_of(setup, s, k);
      if (!shard.stage2() && i % 2 == 0) {
        dev->copy_bytes(shard.grad_ptr(k), g.data(), g.size());
        engine.ready(i);
      } else {
        engine.hand(i, TensorRef{g.data(), kSizes[k], setup.dtype, Device::cpu()});
      }
    }
    const optim::OverlapEngine::RoundEnd end = engine.close_hand_over();
    REQUIRE_FALSE(end.failure.has_value());
    comm::AgreementRecord handed("reduce_gradients");
    handed.field("bucket hand-over order", end.order);
    comm::agree_with_joined(dev->host_comm(), handed);
    engine.settle_round();
    step.run(false, 0.0);
  }

  // Every param's bytes, each read after wait_param (as the next forward would).
  std::vector<uint8_t> bytes() {
    std::vector<uint8_t> out;
    for (std::size_t i = 0; i < kSizes.size(); ++i) {
      engine.wait_param(static_cast<ParamId>(i));
      const auto* p = static_cast<const uint8_t*>(shard.param_ptr(i));
      out.insert(out.end(), p, p + bytes_of(i));
    }
    return out;
  }

  // How many buckets param `id` spans (its wait_param waits for each one's gather).
  int64_t buckets_of(std::size_t id) const {
    const int64_t bucket = optim::bucket_elements(config, setup.dtype);
    const int64_t lo = shard.layout().param_offset[id];
    return (lo + kSizes[id] - 1) / bucket - lo / bucket + 1;
  }

  Setup setup;
  OptimizerConfig config;
  std::unique_ptr<optim::DeviceContext> dev;
  optim::ParamTable table;
  optim::ShardState shard;
  optim::GradReducer reducer;
  optim::ParamSync sync;
  optim::Step step;
  optim::OverlapEngine engine;
  std::vector<std::vector<uint8_t>> initial;
};

bool same(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// `comm` reports a stream (StreamReportingComm, LazyStreamComm); `ops` counts into `counts`.
template <typename StreamComm>
void check_overlapped_on_device(const Setup& s, const std::shared_ptr<StreamComm>& comm,
                                std::unique_ptr<optim::DeviceOps> ops, DeviceCallCounts& counts) {
  INFO(describe(s) << ", " << comm->backend_name());
  std::shared_ptr<Communicator> world = shardopt_test::world();
  Parts plain(std::make_unique<optim::DeviceContext>(world), nullptr, s, OverlapPolicy::off);
  // No communication thread: over a stream-ordered communicator the engine only enqueues.
  Parts device(std::make_unique<optim::DeviceContext>(std::make_shared<Communicator>(comm), std::move(ops)), nullptr,
               s, s.overlap);
  REQUIRE(device.dev->stream_ordered());
  REQUIRE(device.engine.enabled());
  REQUIRE_NOTHROW(device.engine.check_device_path());
  const int world_size = world->size();
  const int buckets = device.engine.num_buckets();
  // Buckets holding some rank's shard: each is gathered as one broadcast group per step.
  int gathered_buckets = 0;
  for (int b = 0; b < buckets && world_size > 1; ++b) {
    const int64_t lo = b * optim::bucket_elements(device.config, s.dtype);
    for (const partition::RankShard& r : device.shard.layout().shards) {
      if (r.numel > 0 && r.offset < lo + optim::bucket_elements(device.config, s.dtype) && r.offset + r.numel > lo) {
        ++gathered_buckets;
        break;
      }
    }
  }
  int64_t expected_param_waits = 0;
  for (std::size_t i = 0; i < kSizes.size() && world_size > 1; ++i) expected_param_waits += device.buckets_of(i);

  const DeviceCallCounts at_start = counts;  // registration made the buffers
  const int64_t host_waits_at_start = comm->host_waits();
  DeviceCallCounts after_first;
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    const int64_t groups_before = comm->groups();
    plain.plain_step(step);
    device.overlapped_step(step);
    // step() left the gathers on the communication stream: exactly one group per bucket
    // (per_bucket gathers each bucket after its update and syncs nothing more).
    CHECK(comm->groups() - groups_before == gathered_buckets);
    const DeviceCallCounts before_waits = counts;
    const std::vector<uint8_t> got = device.bytes();
    // wait_param: the compute stream waits for each of the param's buckets' gathers, on the
    // device; the host neither synchronises nor waits.
    CHECK(counts.event_waits - before_waits.event_waits == expected_param_waits);
    CHECK(counts.synchronizations == before_waits.synchronizations);
    CHECK(counts.events_recorded == before_waits.events_recorded);
    const std::vector<uint8_t> expected = plain.bytes();
    CHECK(same(got, expected));
    if (step == 0) {
      // The step changed the parameters (a comparison that cannot fail would not).
      Parts fresh(std::make_unique<optim::DeviceContext>(world), nullptr, s, OverlapPolicy::off);
      CHECK_FALSE(same(got, fresh.bytes()));
      after_first = counts;
    }
  }
  // After the first round (order learned, buffers and events made), no allocation or event
  // creation; in no step a host synchronisation or a host wait for any collective: every
  // bucket's ordering is on the device.
  CHECK(counts.allocations == after_first.allocations);
  CHECK(counts.events_created == after_first.events_created);
  CHECK(counts.streams_created == 1);
  CHECK(counts.synchronizations == at_start.synchronizations);
  CHECK(comm->host_waits() == host_waits_at_start);
  CHECK(counts.launches > after_first.launches);
  device.engine.wait_all();  // whatever is still queued on a lazy stream runs (every rank alike)
}

std::vector<Setup> all_setups() {
  std::vector<Setup> setups;
  for (int stage : {1, 2}) {
    for (PartitionStrategy partition : {PartitionStrategy::flat, PartitionStrategy::sorted_greedy}) {
      for (DType dtype : {DType::f32, DType::bf16}) {
        for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
          Setup s;
          s.stage = stage;
          s.partition = partition;
          s.dtype = dtype;
          s.overlap = overlap;
          setups.push_back(s);
        }
      }
    }
    for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
      Setup divided;
      divided.stage = stage;
      divided.overlap = overlap;
      divided.other_divisor = true;
      setups.push_back(divided);
    }
  }
  return setups;
}

}  // namespace

TEST_CASE("overlap on the device path equals the plain step bitwise, with no host sync", "[device][overlap]") {
  for (const Setup& s : all_setups()) {
    DeviceCallCounts counts;
    auto comm = std::make_shared<StreamReportingComm>(shardopt_test::world());
    check_overlapped_on_device(s, comm, std::make_unique<HostDeviceOps>(&counts), counts);
  }
}

TEST_CASE("overlap on a communication stream that runs late: every read of a collective's result is ordered after it",
          "[device][overlap]") {
  // The collectives run only when the compute stream (or the host) waits for them: a missing
  // event wait before a division, a per_bucket update, a staging buffer's reuse, the update
  // after backward or a wait_param would read values from before the collective.
  for (const Setup& s : all_setups()) {
    DeviceCallCounts counts;
    auto stream = std::make_shared<LazyStream>();
    auto comm = std::make_shared<LazyStreamComm>(shardopt_test::world(), stream);
    check_overlapped_on_device(s, comm, std::make_unique<LazyDeviceOps>(&counts, stream), counts);
    // The test had something to catch: collectives ran late, on the compute stream's waits.
    if (shardopt_test::world()->size() > 1) CHECK(stream->deferred_runs() > 0);
  }
}

TEST_CASE("overlap on the device path over a host communicator: one rank works, several are refused by name",
          "[device][overlap]") {
  std::shared_ptr<Communicator> world = shardopt_test::world();
  for (int stage : {1, 2}) {
    for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
      Setup s;
      s.stage = stage;
      s.overlap = overlap;
      INFO(describe(s));
      // As ZeroOptimizer wires an MPI communicator with overlap: the thread, the serialised calls.
      const optim::OverlapComm wired = optim::overlap_communicator(world, config_for(s, overlap));
      REQUIRE(wired.thread != nullptr);
      DeviceCallCounts counts;
      Parts device(std::make_unique<optim::DeviceContext>(wired.comm, std::make_unique<HostDeviceOps>(&counts)),
                   wired.thread, s, overlap);
      REQUIRE_FALSE(device.dev->stream_ordered());
      if (world->size() > 1) {
        const auto [code, what] = shardopt_test::error_of([&] { device.engine.check_device_path(); });
        CHECK(code == ErrorCode::unsupported);
        CHECK_THAT(what, Catch::Contains("config.overlap = " + std::string(overlap_policy_name(overlap))) &&
                             Catch::Contains("needs a communicator that runs its collectives on a CUDA stream") &&
                             Catch::Contains("rank " + std::to_string(world->rank())));
        continue;
      }
      // One rank: nothing to reduce or gather; the engine runs on the caller's thread.
      REQUIRE_NOTHROW(device.engine.check_device_path());
      Parts plain(std::make_unique<optim::DeviceContext>(world), nullptr, s, OverlapPolicy::off);
      const int64_t syncs_at_start = counts.synchronizations;
      for (int step = 0; step < kSteps; ++step) {
        plain.plain_step(step);
        device.overlapped_step(step);
        CHECK(same(device.bytes(), plain.bytes()));
      }
      CHECK(counts.synchronizations == syncs_at_start);
    }
  }
}
