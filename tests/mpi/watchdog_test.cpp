// tests/mpi/watchdog_test.cpp — a collective that a peer never joins in time becomes Error(timeout).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "shardopt/shardopt.hpp"

int main() {
  shardopt::CommOptions options;
  options.timeout_seconds = 1.0;
  auto comm = shardopt::mpi_world(options);
  if (comm->size() != 2) {
    std::fprintf(stderr, "watchdog test needs exactly 2 ranks\n");
    return 1;
  }
  int failures = 0;
  if (comm->rank() == 0) {
    try {
      comm->barrier();
      std::fprintf(stderr, "FAIL: barrier returned although rank 1 was late\n");
      ++failures;
    } catch (const shardopt::Error& e) {
      const std::string what = e.what();
      if (e.code() != shardopt::ErrorCode::timeout || what.find("barrier on rank 0 of 2") == std::string::npos) {
        std::fprintf(stderr, "FAIL: unexpected error: %s\n", e.what());
        ++failures;
      } else {
        std::printf("rank 0 got the expected error: %s\n", e.what());
      }
    }
  } else {
    // Late by three timeouts; then joins the barrier rank 0 already started, so both exit.
    std::this_thread::sleep_for(std::chrono::seconds(3));
    comm->barrier();
  }
  std::printf("%d passed, %d failed\n", failures == 0 ? 1 : 0, failures);
  return failures == 0 ? 0 : 1;
}
