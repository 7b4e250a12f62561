// src/comm/watchdog.hpp — deadlines, the polling wait with backoff, and the timeout option's check, shared by the MPI and NCCL watchdogs.
#pragma once

#include <chrono>
#include <cmath>
#include <thread>

#include "core/check.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

using WatchdogClock = std::chrono::steady_clock;

// After `seconds` (never, when <= 0) a wait becomes an error.
class Deadline {
 public:
  explicit Deadline(double seconds) : seconds_(seconds), start_(WatchdogClock::now()) {}
  bool expired() const { return seconds_ > 0 && elapsed() > seconds_; }
  double elapsed() const {
    return std::chrono::duration<double>(WatchdogClock::now() - start_).count();
  }
  double seconds() const { return seconds_; }

 private:
  double seconds_;
  WatchdogClock::time_point start_;
};

// Refuses a timeout that is not a number (a NaN compares false with everything, so it would
// silently mean "no watchdog") or negative (most likely a computed value gone wrong, which must
// not silently disable the watchdog either). 0 is the documented "no watchdog"; +inf waits
// forever too.
inline void check_timeout_option(const CommOptions& options, const char* factory) {
  SHARDOPT_CHECK(!std::isnan(options.timeout_seconds), invalid_argument,
                 "{}: CommOptions.timeout_seconds is NaN; give the number of seconds a "
                 "collective may take, or 0 for no watchdog",
                 factory);
  SHARDOPT_CHECK(options.timeout_seconds >= 0, invalid_argument,
                 "{}: CommOptions.timeout_seconds is {}, negative; give the number of seconds a "
                 "collective may take, or 0 for no watchdog",
                 factory, options.timeout_seconds);
  SHARDOPT_CHECK(options.ranks_per_node >= 0, invalid_argument,
                 "{}: CommOptions.ranks_per_node is {}; give 0 (the ranks that share memory) or a "
                 "positive group size",
                 factory, options.ranks_per_node);
}

// Calls `done()` until it returns true (-> true) or the deadline passes (-> false).
//
// First a short spin (200 us, yielding between polls so that ranks oversubscribing the cores
// let their peers run): a short collective completes within it and pays no sleep. Then sleeps
// that start at 20 us and double up to 1 ms: a long wait (a slow or missing peer) costs about
// a thousand wake-ups a second instead of a busy core, and a collective that ends during the
// wait is seen late by at most about half the time waited so far, and never more than 1 ms.
template <typename Done>
bool poll_until(const Deadline& deadline, const Done& done) {
  using std::chrono::microseconds;
  constexpr double kSpinSeconds = 200e-6;
  constexpr microseconds kFirstSleep{20};
  constexpr microseconds kLongestSleep{1000};
  microseconds sleep = kFirstSleep;
  for (;;) {
    if (done()) return true;
    const double waited = deadline.elapsed();
    if (deadline.seconds() > 0 && waited > deadline.seconds()) return false;
    if (waited < kSpinSeconds) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = sleep * 2 < kLongestSleep ? sleep * 2 : kLongestSleep;
  }
}

}  // namespace comm
}  // namespace shardopt
