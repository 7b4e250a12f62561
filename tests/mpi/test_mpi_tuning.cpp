// tests/mpi/test_mpi_tuning.cpp — the MPI settings shardopt chooses when it initialises MPI: Open MPI's libnbc reduces large nonblocking messages with the binomial tree unless the environment names another algorithm.
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "mpi_test_support.hpp"

namespace {

// The current value of an integer MPI_T control variable, or -1 where this MPI has none of
// that name (not Open MPI, or libnbc not built).
int read_int_cvar(const char* name) {
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return -1;
  int value = -1;
  int index = 0;
  if (MPI_T_cvar_get_index(name, &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      if (count == 1) MPI_T_cvar_read(handle, &value);
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return value;
}

}  // namespace

// The test runner initialises MPI through mpi_world() (mpi_test_main.cpp), so this is the
// setting shardopt leaves: binomial at 1-2 ranks, Open MPI's own choice (0) at 3 or more, where
// the tree would change stage 2's sum order. SHARDOPT_TEST_EXPECT_IREDUCE names the value a run
// expects where its environment chose one itself (tests/mpi/CMakeLists.txt runs it so: the
// user's choice wins).
TEST_CASE("shardopt initialising Open MPI picks libnbc's binomial MPI_Ireduce at 1-2 ranks unless the environment chose") {
  const int algorithm = read_int_cvar("coll_libnbc_ireduce_algorithm");
  if (algorithm < 0) {
    WARN("this MPI has no coll_libnbc_ireduce_algorithm control variable: nothing to check");
    return;
  }
  const char* expected_text = std::getenv("SHARDOPT_TEST_EXPECT_IREDUCE");
  const int expected = expected_text != nullptr ? std::atoi(expected_text) : shardopt_test::world()->size() <= 2 ? 2 : 0;
  INFO("coll_libnbc_ireduce_algorithm is " << algorithm << " (0 ignore, 1 chain, 2 binomial)");
  CHECK(algorithm == expected);
}
