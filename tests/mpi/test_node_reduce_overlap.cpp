// tests/mpi/test_node_reduce_overlap.cpp — config.overlap on one node through the node-shared gradient slots: every hand-over way and policy bitwise the plain step, Join, averages landing before reduce_gradients(), and a peer that never hands a bucket over becoming a named timeout.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_support.hpp"
#include "precision.hpp"  // kernels/: float -> bf16, nearest even

using namespace shardopt;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70, 1};

// How a rank gives its gradients over: from its own buffers (reduce_gradient), or written into
// grad_view and marked with grad_ready (stage 1, and stage 2 on the slots).
enum class Way { handed, views_ready };

std::shared_ptr<Communicator> one_node(double timeout_seconds = 20) {
  CommOptions options;
  options.timeout_seconds = timeout_seconds;
  return mpi_world(options);
}

std::unique_ptr<ZeroOptimizer> build(std::shared_ptr<Communicator> comm, DType dtype, int stage, OverlapPolicy overlap) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.stage = stage;
  config.bucket_bytes = 128;  // several buckets, most of them met by several shards
  config.node_shared_params = true;
  config.overlap = overlap;
  ParamGroupSpec group;
  group.hyper = shardopt_test::busy_hyperparams(Algorithm::adamw);
  for (std::size_t i = 0; i < kSizes.size(); ++i) {
    ParamSpec p;
    p.name = "p" + std::to_string(i);
    p.param = TensorRef{nullptr, kSizes[i], dtype, Device::cpu()};
    group.params.push_back(p);
  }
  return std::make_unique<ZeroOptimizer>(std::move(comm), config, std::vector<ParamGroupSpec>{group});
}

// Different on every rank and round, inexact to sum: the summation order shows in the bits.
std::vector<uint8_t> gradient(DType dtype, int rank, int round, ParamId id) {
  const int64_t n = kSizes[static_cast<std::size_t>(id)];
  const std::vector<float> values = shardopt_test::seeded_values(
      static_cast<uint32_t>(700 + 1000 * round + 37 * rank + static_cast<int>(id)), n);
  std::vector<uint8_t> out(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float x = values[static_cast<std::size_t>(i)];
    if (dtype == DType::f32) {
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      const uint16_t h = kernels::float_to_bf16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Backward order (the last param first); the plain optimizer (overlap off) gets the same values
// through the same way (stage 2 plain and handed: reduce_gradient; views: grad_view in place).
void hand(ZeroOptimizer& opt, DType dtype, int stage, Way way, int round) {
  const bool overlapped = opt.config().overlap != OverlapPolicy::off;
  for (ParamId id = opt.num_params() - 1; id >= 0; --id) {
    if (!opt.trainable(id)) continue;
    std::vector<uint8_t> g = gradient(dtype, world()->rank(), round, id);
    if (stage == 2 && way == Way::handed) {
      opt.reduce_gradient(id, TensorRef{g.data(), kSizes[static_cast<std::size_t>(id)], dtype, Device::cpu()});
      continue;
    }
    std::memcpy(opt.grad_view(id).data, g.data(), g.size());
    if (overlapped) opt.grad_ready(id);
  }
}

std::vector<uint8_t> grad_bytes(const ZeroOptimizer& opt) {
  std::vector<uint8_t> out;
  for (ParamId id = 0; id < opt.num_params(); ++id) {
    const TensorRef g = opt.grad_view(id);
    const auto* p = static_cast<const uint8_t*>(g.data);
    out.insert(out.end(), p, p + g.nbytes());
  }
  return out;
}

}  // namespace

TEST_CASE("overlap on the node's gradient slots steps bitwise as the plain step: stage 1 and 2, after_backward and "
          "per_bucket, handed or through grad_view, f32 and bf16, across a layout change",
          "[node_sharing][node_reduce][overlap]") {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int stage : {1, 2}) {
      for (Way way : {Way::handed, Way::views_ready}) {
        if (stage == 1 && way == Way::handed) continue;  // stage 1's way is the views
        // One rank has no slots: stage 2 keeps no gradient views there.
        if (stage == 2 && way == Way::views_ready && world()->size() == 1) continue;
        for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
          CAPTURE(static_cast<int>(dtype), stage, static_cast<int>(way), overlap_policy_name(overlap));
          // A communicator each: the overlapped optimizer's queued work never meets the plain one's.
          std::unique_ptr<ZeroOptimizer> plain = build(one_node(), dtype, stage, OverlapPolicy::off);
          std::unique_ptr<ZeroOptimizer> overlapped = build(one_node(), dtype, stage, overlap);
          // No staging beside the slots on one node (the MPI path stages stage 2's buckets).
          if (world()->size() > 1) CHECK(overlapped->memory_report().buffer_bytes == 0);
          for (int round = 1; round <= 4; ++round) {
            if (round == 4) {
              plain->set_trainable(3, false);
              overlapped->set_trainable(3, false);
            }
            hand(*plain, dtype, stage, way, round);
            hand(*overlapped, dtype, stage, way, round);
            plain->reduce_gradients();
            overlapped->reduce_gradients();
            // Stage 1: every rank's views hold the whole average, as after the plain reduction.
            if (stage == 1) REQUIRE(grad_bytes(*overlapped) == grad_bytes(*plain));
            plain->step();
            overlapped->step();
            REQUIRE(shardopt_test::param_bytes(*overlapped) == shardopt_test::param_bytes(*plain));
          }
        }
      }
    }
  }
}

TEST_CASE("overlap on the slots: a bucket's average lands in every rank's grad_view once all ranks have handed it, "
          "before reduce_gradients()",
          "[node_sharing][node_reduce][overlap]") {
  if (world()->size() < 2) return;
  std::unique_ptr<ZeroOptimizer> plain = build(one_node(), DType::f32, 1, OverlapPolicy::off);
  std::unique_ptr<ZeroOptimizer> overlapped = build(one_node(), DType::f32, 1, OverlapPolicy::after_backward);
  hand(*plain, DType::f32, 1, Way::views_ready, 1);
  plain->reduce_gradients();
  const std::vector<uint8_t> average = grad_bytes(*plain);
  hand(*overlapped, DType::f32, 1, Way::views_ready, 1);
  // Every bucket is complete on this rank; the peers' threads sum theirs as soon as every rank
  // is here. Polled (the threads run on their own), bounded by a deadline far beyond need.
  bool landed = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!landed && std::chrono::steady_clock::now() < deadline) {
    std::atomic_thread_fence(std::memory_order_acquire);
    landed = grad_bytes(*overlapped) == average;
    if (!landed) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(landed);
  overlapped->reduce_gradients();
  REQUIRE(grad_bytes(*overlapped) == average);
  plain->step();
  overlapped->step();
  REQUIRE(shardopt_test::param_bytes(*overlapped) == shardopt_test::param_bytes(*plain));
}

TEST_CASE("overlap on the slots with a rank in join(): the active ranks' average divided by the ranks that "
          "contributed, bitwise the plain step's",
          "[node_sharing][node_reduce][overlap][join]") {
  const int n = world()->size();
  if (n < 2) return;
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    std::unique_ptr<ZeroOptimizer> plain = build(one_node(), DType::f32, stage, OverlapPolicy::off);
    std::unique_ptr<ZeroOptimizer> overlapped = build(one_node(), DType::f32, stage, OverlapPolicy::after_backward);
    const bool joined = world()->rank() == n - 1;  // the last rank runs out of data first
    for (ZeroOptimizer* opt : {plain.get(), overlapped.get()}) {
      for (int round = 1; round <= 2 && !joined; ++round) {
        hand(*opt, DType::f32, stage, Way::views_ready, round);
        opt->reduce_gradients();
        opt->step();
      }
      opt->join();  // the joined rank shadows both rounds with zeros
    }
    REQUIRE(shardopt_test::param_bytes(*overlapped) == shardopt_test::param_bytes(*plain));
  }
}

TEST_CASE("overlap on the slots: a peer that never hands a bucket over is Error(timeout) on every rank, naming "
          "the bucket, instead of a hang",
          "[node_sharing][node_reduce][overlap]") {
  if (world()->size() != 2) return;
  std::unique_ptr<ZeroOptimizer> opt = build(one_node(2), DType::f32, 1, OverlapPolicy::after_backward);
  const int rank = world()->rank();
  std::string message;
  ErrorCode code = ErrorCode::internal;
  try {
    // The first grad_ready opens the round on both ranks; rank 1's backward then stalls past
    // the 2 s timeout before it hands the rest: rank 0's thread gives up on the first bucket it
    // waits for, so rank 1 waits in vain for rank 0's sum of it.
    const ParamId last = opt->num_params() - 1;
    opt->grad_ready(last);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3000));
    for (ParamId id = last - 1; id >= 0; --id) opt->grad_ready(id);
    opt->reduce_gradients();
  } catch (const Error& e) {
    code = e.code();
    message = e.what();
  }
  CAPTURE(rank, message);
  CHECK(code == ErrorCode::timeout);
  CHECK(message.find("node-shared gradient slots") != std::string::npos);
  CHECK(message.find(rank == 0 ? "was handed over by 1 of the node's 2 ranks within 2 s"
                               : "was summed by 1 of the node's 2 ranks within 2 s") != std::string::npos);
}
