// tests/mpi/short_timeout_main.cpp — Catch2 runner for multi-rank tests that provoke disagreements: a 20 s collective timeout, so a rank left behind fails fast instead of hanging CI.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "mpi_test_support.hpp"

namespace shardopt_test {

std::shared_ptr<shardopt::Communicator>& world() {
  static std::shared_ptr<shardopt::Communicator> comm;
  return comm;
}

}  // namespace shardopt_test

int main(int argc, char** argv) {
  shardopt::CommOptions options;
  options.timeout_seconds = 20;
  shardopt_test::world() = shardopt::mpi_world(options);
  const int failed = Catch::Session().run(argc, argv);
  // Every rank reports; the job fails if any rank failed.
  float worst = static_cast<float>(failed);
  shardopt_test::world()->all_reduce(&worst, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  shardopt_test::world().reset();
  return worst > 0 ? 1 : 0;
}
