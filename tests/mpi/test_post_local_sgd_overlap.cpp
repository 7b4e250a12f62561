// tests/mpi/test_post_local_sgd_overlap.cpp — post-local SGD over an overlapped optimizer: refused by name on every rank where warmup would average gradients beside the communication thread; what stays allowed runs bitwise as without overlap.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "mpi_test_support.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_test {

std::shared_ptr<shardopt::Communicator>& world() {
  static std::shared_ptr<shardopt::Communicator> comm;
  return comm;
}

}  // namespace shardopt_test

using namespace shardopt;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

const std::vector<int64_t> kSizes = {37, 5, 130};

std::unique_ptr<ZeroOptimizer> replica_optimizer(std::shared_ptr<Communicator> replica, OverlapPolicy overlap,
                                                 shardopt_test::SeededParams& params) {
  OptimizerConfig config;
  config.algorithm = Algorithm::adamw;
  config.overlap = overlap;
  return std::make_unique<ZeroOptimizer>(std::move(replica), config, std::vector<ParamGroupSpec>{params.all()});
}

// Three steps of post-local SGD (period 2, no warmup) over one-rank replicas; the parameters.
std::vector<float> run_without_warmup(OverlapPolicy overlap) {
  const int rank = world()->rank();
  shardopt_test::SeededParams params(kSizes, 5);
  std::unique_ptr<ZeroOptimizer> opt = replica_optimizer(world()->split(rank, 0), overlap, params);
  PostLocalSGDOptimizer plsgd(world(), *opt, periodic_averager(2));
  for (int t = 0; t < 3; ++t) {
    for (ParamId id = 0; id < opt->num_params(); ++id) {
      const std::vector<float> g = shardopt_test::seeded_values(300u + 7u * static_cast<uint32_t>(rank + 3 * t) +
                                                                    static_cast<uint32_t>(id),
                                                                kSizes[static_cast<std::size_t>(id)], 0.5f);
      std::memcpy(opt->grad_view(id).data, g.data(), g.size() * sizeof(float));
    }
    plsgd.reduce_gradients();
    plsgd.step();
  }
  opt->wait_all();
  std::vector<float> out;
  for (ParamId id = 0; id < opt->num_params(); ++id) {
    const TensorRef v = opt->param_view(id);
    out.insert(out.end(), v.as<float>(), v.as<float>() + v.numel);
  }
  return out;
}

}  // namespace

TEST_CASE("post-local SGD with warmup over an overlapped optimizer is refused by name on every rank",
          "[averaging][overlap]") {
  if (world()->size() < 2) return;
  const int rank = world()->rank();
  shardopt_test::SeededParams params(kSizes, 5);
  std::unique_ptr<ZeroOptimizer> opt = replica_optimizer(world()->split(rank, 0), OverlapPolicy::after_backward, params);
  const auto [code, message] = error_of([&] { PostLocalSGDOptimizer plsgd(world(), *opt, periodic_averager(2, 3)); });
  CHECK(code == ErrorCode::unsupported);
  CHECK_THAT(message, Catch::Contains("PostLocalSGDOptimizer") && Catch::Contains("config.overlap is after_backward") &&
                          Catch::Contains("warmup"));
  // Nothing was left half-built: the world's next collective pairs up, and the optimizer and an
  // averager (parameter averaging alone, which waits for the overlap's queue) still work.
  float one = 1.f;
  world()->all_reduce(&one, 1, DType::f32, ReduceOp::sum);
  CHECK(one == static_cast<float>(world()->size()));
  ModelAverager averager(world(), *opt, periodic_averager(1));
  opt->reduce_gradients();
  opt->step();
  averager.average_parameters();
  CHECK(averager.step() == 1);
}

TEST_CASE("one rank's overlapped optimizer fails post-local SGD's construction on every rank", "[averaging][overlap]") {
  if (world()->size() < 2) return;
  const int rank = world()->rank();
  shardopt_test::SeededParams params(kSizes, 5);
  std::unique_ptr<ZeroOptimizer> opt =
      replica_optimizer(world()->split(rank, 0), rank == 0 ? OverlapPolicy::per_bucket : OverlapPolicy::off, params);
  const auto [code, message] = error_of([&] { PostLocalSGDOptimizer plsgd(world(), *opt, periodic_averager(2, 1)); });
  CHECK(code == ErrorCode::unsupported);
  CHECK_THAT(message, Catch::Contains("config.overlap is per_bucket"));
}

TEST_CASE("without warmup, post-local SGD over an overlapped optimizer equals the run without overlap bitwise",
          "[averaging][overlap]") {
  const std::vector<float> plain = run_without_warmup(OverlapPolicy::off);
  const std::vector<float> overlapped = run_without_warmup(OverlapPolicy::after_backward);
  REQUIRE(plain.size() == overlapped.size());
  CHECK(std::memcmp(plain.data(), overlapped.data(), plain.size() * sizeof(float)) == 0);
}

int main(int argc, char** argv) {
  shardopt::CommOptions options;
  options.timeout_seconds = 10;  // a regression (a hang beside the communication thread) fails fast
  shardopt_test::world() = shardopt::mpi_world(options);
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  shardopt_test::world()->all_reduce(&worst, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  shardopt_test::world().reset();
  return worst > 0 ? 1 : 0;
}
