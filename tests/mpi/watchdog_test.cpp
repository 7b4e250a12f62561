// tests/mpi/watchdog_test.cpp — a collective a peer never joins in time becomes Error(timeout), costs little CPU while it waits, and poisons its communicator.
//
// Rank 1 is late on purpose (it sleeps past rank 0's timeout), so this runs as a plain
// program at exactly 2 ranks rather than inside the Catch2 runner.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "shardopt/shardopt.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// User + system CPU time of this process so far.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    ++failures;
  }
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `call`, which must raise Error(timeout) whose message has every string of `parts`;
// returns how long it took.
template <typename Call>
double expect_timeout(const char* what, const std::vector<std::string>& parts, const Call& call) {
  const auto start = Clock::now();
  try {
    call();
    expect(false, std::string(what) + " returned although rank 1 was late");
  } catch (const shardopt::Error& e) {
    bool named = e.code() == shardopt::ErrorCode::timeout;
    for (const std::string& part : parts) named = named && contains(e.what(), part);
    expect(named, std::string(what) + ": unexpected error: " + e.what());
    std::printf("rank 0, %s: %s\n", what, e.what());
  }
  return seconds_since(start);
}

}  // namespace

int main() {
  constexpr double kTimeout = 2.0;
  shardopt::CommOptions options;
  options.timeout_seconds = kTimeout;
  auto comm = shardopt::mpi_world(options);
  if (comm->size() != 2) {
    std::fprintf(stderr, "watchdog test needs exactly 2 ranks\n");
    return 1;
  }
  // Issued and completed by both ranks before rank 1 goes missing; rank 0 waits only later.
  std::vector<float> mine(3, static_cast<float>(comm->rank())), all(6);
  auto early = comm->all_gather_async(mine.data(), all.data(), 3, shardopt::DType::f32);

  if (comm->rank() == 0) {
    const double cpu_before = cpu_seconds();
    const double waited = expect_timeout("barrier", {"barrier on rank 0 of 2", "did not complete within 2 s"},
                                         [&] { comm->barrier(); });
    const double cpu = cpu_seconds() - cpu_before;
    std::printf("rank 0 waited %.2f s for the timeout, using %.3f s of CPU\n", waited, cpu);
    expect(waited >= kTimeout && waited < kTimeout + 1.0, "the barrier timed out after " + std::to_string(waited) + " s");
    // A busy loop would cost about as much CPU as wall time.
    expect(cpu < 0.3 * waited, "waiting out the timeout used " + std::to_string(cpu) + " s of CPU in " +
                                   std::to_string(waited) + " s");

    // The communicator is poisoned: later calls and older handles fail at once, naming the barrier.
    const std::vector<std::string> names_barrier = {"barrier on rank 0 of 2 did not complete", "refused"};
    const double again = expect_timeout("all_reduce after the timeout", names_barrier, [&] {
      float x = 1.f;
      comm->all_reduce(&x, 1, shardopt::DType::f32, shardopt::ReduceOp::sum);
    });
    expect(again < 0.2 * kTimeout, "the all_reduce after the timeout took " + std::to_string(again) + " s");
    const double older = expect_timeout("the all_gather issued before the timeout", names_barrier, [&] { early->wait(); });
    expect(older < 0.2 * kTimeout, "waiting for the older all_gather took " + std::to_string(older) + " s");
    expect_timeout("split after the timeout", names_barrier, [&] { comm->split(0, 0); });
    char byte = 0;
    expect_timeout("broadcast_async after the timeout", names_barrier,
                   [&] { comm->broadcast_async(&byte, 1, shardopt::DType::byte, 0); });
  } else {
    early->wait();
    // Late by well over the timeout; then joins the barrier rank 0 already started, so that
    // its request completes and both processes can finalise MPI.
    std::this_thread::sleep_for(std::chrono::duration<double>(kTimeout + 1.5));
    comm->barrier();
  }
  std::printf("rank %d: %d passed, %d failed\n", comm->rank(), failures == 0 ? 1 : 0, failures);
  return failures == 0 ? 0 : 1;
}
