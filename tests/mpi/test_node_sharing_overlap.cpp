// tests/mpi/test_node_sharing_overlap.cpp — node-shared parameters with config.overlap, on even and uneven nodes (CommOptions.ranks_per_node): bitwise the same run without overlap, and no shared-memory segment left behind.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "shm_segments.hpp"

using namespace shardopt;
using shardopt_test::segments_of_this_job;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {37, 64, 5, 130, 19, 70};
constexpr int kSteps = 3;

// Short: a rank left behind by a regression fails the test in seconds instead of hanging it.
std::shared_ptr<Communicator> nodes_of(int ranks_per_node) {
  CommOptions options;
  options.timeout_seconds = 20;
  options.ranks_per_node = ranks_per_node;
  return mpi_world(options);
}

std::vector<float> grad_of(int rank, int step, std::size_t param) {
  return shardopt_test::seeded_values(500u + static_cast<uint32_t>(rank * 31 + step * 7) + static_cast<uint32_t>(param),
                                      kSizes[param]);
}

struct Model {
  shardopt_test::SeededParams params{kSizes, 9};
  std::unique_ptr<ZeroOptimizer> opt;
  int stage;

  Model(std::shared_ptr<Communicator> comm, int stage_, OverlapPolicy overlap) : stage(stage_) {
    OptimizerConfig config;
    config.algorithm = Algorithm::adamw;
    config.stage = stage;
    config.bucket_bytes = 256;  // several buckets
    config.node_shared_params = true;
    config.overlap = overlap;
    opt = std::make_unique<ZeroOptimizer>(std::move(comm), config,
                                          std::vector<ParamGroupSpec>{params.all(shardopt_test::busy_hyperparams(Algorithm::adamw))});
  }

  // Gradients handed in backward order (stage 1 in place plus grad_ready when overlapped).
  void train_step(int step) {
    shardopt_test::hand_gradients_backward(
        *opt, stage, [&](ParamId i) { return grad_of(world()->rank(), step, static_cast<std::size_t>(i)); });
    opt->reduce_gradients();
    opt->step();
  }

  std::vector<uint8_t> bytes() { return shardopt_test::param_bytes(*opt); }
};

}  // namespace

TEST_CASE("node-shared parameters with overlap step bitwise as without, on even and uneven nodes",
          "[node_sharing][overlap]") {
  world()->barrier();
  const std::set<std::string> before = segments_of_this_job();
  // 0: one node (the gradient slots); 2 ranks per node: uneven nodes at 3 ranks; 3: uneven at
  // 2 and 4 ranks.
  for (int per_node : {0, 2, 3}) {
    for (int stage : {1, 2}) {
      for (OverlapPolicy overlap : {OverlapPolicy::after_backward, OverlapPolicy::per_bucket}) {
        INFO("ranks_per_node " << per_node << ", stage " << stage << ", " << overlap_policy_name(overlap));
        // A communicator each: the overlapped optimizer's queued work never meets the plain one's.
        Model plain(nodes_of(per_node), stage, OverlapPolicy::off);
        Model overlapped(nodes_of(per_node), stage, overlap);
        // Both share (every node does once one holds several ranks): shared compared with shared.
        CHECK((overlapped.opt->memory_report().node_shared_param_bytes > 0) == (world()->size() > 1));
        CHECK(overlapped.opt->memory_report().node_shared_param_bytes ==
              plain.opt->memory_report().node_shared_param_bytes);
        for (int step = 0; step < kSteps; ++step) {
          plain.train_step(step);
          overlapped.train_step(step);
          REQUIRE(overlapped.bytes() == plain.bytes());
        }
        // A layout change re-lays out the shared buffer through the overlapped communicator.
        plain.opt->set_trainable(3, false);
        overlapped.opt->set_trainable(3, false);
        plain.train_step(kSteps);
        overlapped.train_step(kSteps);
        REQUIRE(overlapped.bytes() == plain.bytes());
      }
    }
  }
  world()->barrier();
  const std::set<std::string> after = segments_of_this_job();
  std::vector<std::string> left;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(left));
  CHECK(left == std::vector<std::string>{});
}
