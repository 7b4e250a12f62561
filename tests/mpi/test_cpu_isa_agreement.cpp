// tests/mpi/test_cpu_isa_agreement.cpp — a SHARDOPT_CPU_ISA that one rank cannot use fails the constructor on every rank together (run by mpi_refused_cpu_isa_np2 with rank 1 asking for an unknown ISA).
#include <cstdlib>
#include <string>

#include "mpi_test_support.hpp"

using namespace shardopt;
using shardopt_test::world;

TEST_CASE("an ISA one rank cannot use fails the constructor on every rank", "[.cpu_isa_refused]") {
  const char* requested = std::getenv("SHARDOPT_CPU_ISA");
  CAPTURE(world()->rank(), requested != nullptr ? requested : "(unset)");
  shardopt_test::SeededParams model({100, 7}, 3);
  const auto [code, message] = shardopt_test::error_of([&] { ZeroOptimizer opt(world(), OptimizerConfig{}, {model.all()}); });
  CHECK(code == ErrorCode::invalid_argument);
  // Rank 1 raises its own error; the others name the rank it failed on.
  const std::string own = "SHARDOPT_CPU_ISA=sse9: unknown; use baseline, avx2, avx512 or auto";
  CHECK_THAT(message, Catch::StartsWith(world()->rank() == 1 ? own : "ZeroOptimizer failed on rank 1: " + own));
}
