// tests/mpi/test_averaging_warmup_agreement.cpp — post-local SGD's warmup averages gradients across the replicas only after the ranks agree on which: a different hand-over order or other trainable flags are a named mismatch on every rank.
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

// Two parameters of equal size: handed in the wrong order, their gradients would average
// with each other without any size mismatch to notice.
const std::vector<int64_t> kSizes = {8, 8, 5};

struct OneRankReplica {
  shardopt_test::SeededParams params{kSizes, 3};
  std::unique_ptr<ZeroOptimizer> opt;

  explicit OneRankReplica(int stage) {
    OptimizerConfig config;
    config.stage = stage;
    opt = std::make_unique<ZeroOptimizer>(world()->split(world()->rank(), 0), config,
                                          std::vector<ParamGroupSpec>{params.all()});
  }
};

std::vector<float> grad_of(ParamId id) {
  return shardopt_test::seeded_values(50u + static_cast<uint32_t>(id) + 7u * static_cast<uint32_t>(world()->rank()),
                                      kSizes[static_cast<std::size_t>(id)]);
}

}  // namespace

TEST_CASE("warmup's reduce_gradient: ranks handing parameters in different orders get a named mismatch",
          "[averaging][agreement]") {
  if (world()->size() < 2) return;
  OneRankReplica replica(2);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, periodic_averager(2, 2));
  // Rank 1 hands p1 first, the others p0.
  const ParamId first = world()->rank() == 1 ? 1 : 0;
  std::vector<float> g = grad_of(first);
  const auto [code, message] = error_of([&] { plsgd.reduce_gradient(first, TensorRef{g.data(), kSizes[0]}); });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(message, Catch::Contains("reduce_gradient") && Catch::Contains("parameter") &&
                          Catch::Contains("'p0'") && Catch::Contains("'p1'"));
  // Nothing was reduced: the world's next collective pairs up.
  float one = 1.f;
  world()->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  CHECK(one == static_cast<float>(world()->size()));
}

TEST_CASE("warmup's reduce_gradient: a bad gradient on one rank fails every rank by name", "[averaging][agreement]") {
  if (world()->size() < 2) return;
  OneRankReplica replica(2);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, periodic_averager(2, 2));
  // The last rank hands p2's gradient with p0's size.
  const bool bad = world()->rank() == world()->size() - 1;
  std::vector<float> g = grad_of(2);
  const auto [code, message] =
      error_of([&] { plsgd.reduce_gradient(2, TensorRef{g.data(), bad ? kSizes[0] : kSizes[2]}); });
  CHECK(code == ErrorCode::invalid_argument);
  CHECK_THAT(message, Catch::Contains("reduce_gradient('p2')") && Catch::Contains("expected 5"));
}

TEST_CASE("warmup's reduce_gradients: replicas with other trainable flags get a named mismatch",
          "[averaging][agreement]") {
  if (world()->size() < 2) return;
  OneRankReplica replica(1);
  PostLocalSGDOptimizer plsgd(world(), *replica.opt, periodic_averager(2, 2));
  // set_trainable is collective within a replica only: rank 1's replica freezes p1 alone.
  if (world()->rank() == 1) replica.opt->set_trainable(1, false);
  for (ParamId id = 0; id < replica.opt->num_params(); ++id) {
    const std::vector<float> g = grad_of(id);
    std::memcpy(replica.opt->grad_view(id).data, g.data(), g.size() * sizeof(float));
  }
  const auto [code, message] = error_of([&] { plsgd.reduce_gradients(); });
  CHECK(code == ErrorCode::mismatch);
  CHECK_THAT(message, Catch::Contains("reduce_gradients") && Catch::Contains("gradients averaged across the replicas"));
  float one = 1.f;
  world()->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  CHECK(one == static_cast<float>(world()->size()));
}
