// tests/remote/remote_test_main.cpp — Catch2 runner for the remote optimizer's multi-rank tests: MPI with MPI_THREAD_MULTIPLE (remote_mpi_world) and a 20 s collective timeout, so a rank left behind fails fast.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "../mpi/mpi_test_support.hpp"

namespace shardopt_test {

std::shared_ptr<shardopt::Communicator>& world() {
  static std::shared_ptr<shardopt::Communicator> comm;
  return comm;
}

}  // namespace shardopt_test

int main(int argc, char** argv) {
  shardopt::CommOptions options;
  options.timeout_seconds = 20;
  shardopt_test::world() = shardopt::remote_mpi_world(options);
  const int failed = Catch::Session().run(argc, argv);
  float worst = static_cast<float>(failed);
  shardopt_test::world()->all_reduce(&worst, 1, shardopt::DType::f32, shardopt::ReduceOp::max);
  shardopt_test::world().reset();
  return worst > 0 ? 1 : 0;
}
