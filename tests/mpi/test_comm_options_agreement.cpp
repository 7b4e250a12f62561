// tests/mpi/test_comm_options_agreement.cpp — ranks that create a communicator with different or invalid CommOptions all get the same named error at once, never a hang.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <limits>
#include <string>

#include "mpi_test_support.hpp"

using shardopt::CommOptions;
using shardopt::DType;
using shardopt::ErrorCode;
using shardopt::ReduceOp;
using shardopt_test::error_of;
using shardopt_test::world;

namespace {

// Short, so that a rank left behind fails the case in seconds instead of hanging it.
constexpr double kTimeout = 5.0;

CommOptions with_timeout(double seconds) {
  CommOptions options;
  options.timeout_seconds = seconds;
  return options;
}

// Creates a communicator from MPI_COMM_WORLD (`borrowed`: through mpi_borrow) and runs what
// uses ranks_per_node, split_node(): without the agreement, different values part the ranks
// there (MPI_Comm_split on some, the new communicator's barrier on the others).
void create_and_split_node(const CommOptions& options, bool borrowed) {
  MPI_Comm parent = MPI_COMM_WORLD;
  auto comm = borrowed ? shardopt::mpi_borrow(&parent, options) : shardopt::mpi_world(options);
  comm->split_node();
}

}  // namespace

TEST_CASE("different ranks_per_node on the ranks: Error(mismatch) naming it on every rank", "[comm][options]") {
  const int me = world()->rank();
  if (world()->size() < 2) return;  // nothing to disagree with
  for (const bool borrowed : {false, true}) {
    CAPTURE(borrowed);
    CommOptions options = with_timeout(kTimeout);
    options.ranks_per_node = me == 0 ? 0 : 1;
    const auto [code, message] = error_of([&] { create_and_split_node(options, borrowed); });
    CAPTURE(message);
    REQUIRE(code == ErrorCode::mismatch);
    const std::string factory = borrowed ? "mpi_borrow" : "mpi_world";
    REQUIRE_THAT(message, Catch::StartsWith(factory + ": ranks disagree on CommOptions.ranks_per_node: rank 0 has 0, "
                                                      "rank 1 has 1"));
    // Nothing was left half-done: the world goes on.
    float x = 1.f;
    world()->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    REQUIRE(x == static_cast<float>(world()->size()));
  }
}

TEST_CASE("the same positive ranks_per_node on every rank splits as before", "[comm][options]") {
  CommOptions options = with_timeout(kTimeout);
  options.ranks_per_node = 1;
  auto comm = shardopt::mpi_world(options);
  auto node = comm->split_node();
  REQUIRE(node != nullptr);
  REQUIRE(node->size() == 1);
}

TEST_CASE("a watchdog on some ranks only, or different timeouts: Error(mismatch) naming timeout_seconds",
          "[comm][options]") {
  const int me = world()->rank();
  if (world()->size() < 2) return;
  // Off on the others: they would skip the watched exit barrier that rank 0 enters.
  auto [code, message] = error_of([&] { shardopt::mpi_world(with_timeout(me == 0 ? kTimeout : 0.0)); });
  CAPTURE(message);
  REQUIRE(code == ErrorCode::mismatch);
  REQUIRE_THAT(message, Catch::StartsWith("mpi_world: ranks disagree on CommOptions.timeout_seconds: rank 0 has 5, "
                                          "rank 1 has 0 (no watchdog)"));
  std::tie(code, message) = error_of([&] { shardopt::mpi_world(with_timeout(me == 0 ? kTimeout : 2 * kTimeout)); });
  REQUIRE(code == ErrorCode::mismatch);
  REQUIRE_THAT(message, Catch::StartsWith("mpi_world: ranks disagree on CommOptions.timeout_seconds: rank 0 has 5, "
                                          "rank 1 has 10"));
  // 0 and +inf both mean no watchdog: the same setting, and the communicator works.
  auto unwatched = shardopt::mpi_world(with_timeout(me == 0 ? 0.0 : std::numeric_limits<double>::infinity()));
  float x = 1.f;
  unwatched->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  REQUIRE(x == static_cast<float>(world()->size()));
}

TEST_CASE("an invalid option on one rank fails the creation on every rank by name", "[comm][options]") {
  const int me = world()->rank();
  if (world()->size() < 2) return;
  const int culprit = world()->size() - 1;
  CommOptions options = with_timeout(kTimeout);
  if (me == culprit) options.timeout_seconds = std::numeric_limits<double>::quiet_NaN();
  auto [code, message] = error_of([&] { shardopt::mpi_world(options); });
  CAPTURE(message);
  REQUIRE(code == ErrorCode::invalid_argument);
  const std::string nan = "mpi_world: CommOptions.timeout_seconds is NaN";
  if (me == culprit) {
    REQUIRE_THAT(message, Catch::StartsWith(nan));
  } else {
    REQUIRE_THAT(message, Catch::StartsWith("mpi_world failed on rank " + std::to_string(culprit) + ": " + nan));
  }
  options = with_timeout(kTimeout);
  if (me == culprit) options.ranks_per_node = -2;
  std::tie(code, message) = error_of([&] { shardopt::mpi_world(options); });
  REQUIRE(code == ErrorCode::invalid_argument);
  REQUIRE_THAT(message, Catch::Contains("mpi_world: CommOptions.ranks_per_node is -2"));
}
