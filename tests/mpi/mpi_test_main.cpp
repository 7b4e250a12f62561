// tests/mpi/mpi_test_main.cpp — Catch2 runner for tests launched by mpiexec: one world per process.
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
  options.timeout_seconds = 120;  // a failed assertion on one rank must not hang the others
  shardopt_test::world() = shardopt::mpi_world(options);
  const int failed = Catch::Session().run(argc, argv);
  // Every rank reports; the job fails if any rank failed.
  float worst = static_cast<float>(failed);
  shardopt_test::world()->all_reduce(&worst, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  shardopt_test::world().reset();
  return worst > 0 ? 1 : 0;
}
