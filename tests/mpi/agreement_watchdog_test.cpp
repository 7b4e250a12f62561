// tests/mpi/agreement_watchdog_test.cpp — an optimizer call whose opening agreement a peer joins only after the timeout: Error(timeout) on the caller, and the late peer's record lands in memory that is still allocated.
//
// Rank 0's step() all-gathers the agreement records and times out; the all-gather stays live
// in MPI. Rank 1, late, calls reduce_gradients(): its all-gather matches rank 0's (so it gets
// Error(mismatch) naming both calls, at once), and MPI writes rank 1's record into rank 0's
// receive buffer when rank 0 next progresses MPI, at exit, after step() has long returned. That
// buffer must still be allocated then, which the AddressSanitizer build checks. A plain program
// at exactly 2 ranks, as watchdog_test.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `call`, which must raise Error(`code`) whose message has every string of `parts`.
template <typename Call>
void expect_error(const char* what, shardopt::ErrorCode code, const std::vector<std::string>& parts, const Call& call) {
  try {
    call();
    expect(false, std::string(what) + " returned");
  } catch (const shardopt::Error& e) {
    bool named = e.code() == code;
    for (const std::string& part : parts) named = named && contains(e.what(), part);
    expect(named, std::string(what) + ": unexpected error: " + e.what());
    std::printf("%s: %s\n", what, e.what());
  }
}

}  // namespace

int main() {
  constexpr double kTimeout = 2.0;
  shardopt::CommOptions options;
  options.timeout_seconds = kTimeout;
  auto comm = shardopt::mpi_world(options);
  if (comm->size() != 2) {
    std::fprintf(stderr, "agreement watchdog test needs exactly 2 ranks\n");
    return 1;
  }
  {
    std::vector<float> values(64, 0.5f);
    shardopt::ParamGroupSpec group;
    shardopt::ParamSpec p;
    p.name = "w";
    p.param = shardopt::TensorRef{values.data(), 64};
    group.params.push_back(p);
    shardopt::OptimizerConfig config;
    config.node_shared_params = false;
    shardopt::ZeroOptimizer opt(comm, config, {group});
    if (comm->rank() == 0) {
      expect_error("rank 0, step", shardopt::ErrorCode::timeout, {"step", "all_gather", "did not complete within 2 s"},
                   [&] { opt.step(); });
    } else {
      // Late by well over rank 0's timeout, so rank 0 has left step() (and this scope).
      std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 1.5));
      expect_error("rank 1, reduce_gradients", shardopt::ErrorCode::mismatch,
                   {"ranks are in different calls", "rank 0 is in step()", "rank 1 is in reduce_gradients()"},
                   [&] { opt.reduce_gradients(); });
    }
  }
  std::printf("rank %d: %s\n", comm->rank(), failures == 0 ? "ok" : "FAILED");
  return failures == 0 ? 0 : 1;
}
