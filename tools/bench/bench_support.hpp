// tools/bench/bench_support.hpp — small helpers every benchmark mode shares: timing, medians, int64 gathers over a Communicator, rank-0 printing, thread counts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <fmt/format.h>

#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

using shardopt::Communicator;
using shardopt::DType;
using shardopt::ReduceOp;

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// Every rank's value, in rank order. bf16 collectives move raw 16-bit words (MPI_UINT16_T,
// no arithmetic), so four of them carry an int64 exactly, which f32 could not.
inline std::vector<int64_t> gather_int64(Communicator& comm, int64_t value) {
  std::vector<int64_t> all(static_cast<std::size_t>(comm.size()));
  all[static_cast<std::size_t>(comm.rank())] = value;
  constexpr int64_t words = sizeof(int64_t) / 2;
  comm.all_gather(&all[static_cast<std::size_t>(comm.rank())], all.data(), words, DType::bf16);
  return all;
}

inline int64_t sum_int64(Communicator& comm, int64_t value) {
  int64_t total = 0;
  for (int64_t v : gather_int64(comm, value)) total += v;
  return total;
}

inline int64_t max_int64(Communicator& comm, int64_t value) {
  const std::vector<int64_t> all = gather_int64(comm, value);
  return *std::max_element(all.begin(), all.end());
}

// Per-iteration seconds -> the slowest rank's seconds for each iteration. What a user waits
// for is the last rank to finish.
inline std::vector<double> slowest_rank(Communicator& comm, const std::vector<double>& seconds) {
  std::vector<float> buffer(seconds.begin(), seconds.end());
  if (!buffer.empty()) comm.all_reduce(buffer.data(), static_cast<int64_t>(buffer.size()), DType::f32, ReduceOp::max);
  return std::vector<double>(buffer.begin(), buffer.end());
}

// Rank 0 prints; everyone else stays quiet. Flushed at once so mpirun's output keeps order.
template <typename... Args>
void say(const Communicator& comm, fmt::format_string<Args...> format, Args&&... args) {
  if (comm.rank() != 0) return;
  fmt::print(format, std::forward<Args>(args)...);
  std::fflush(stdout);
}

inline int effective_threads(int threads) {
#ifdef _OPENMP
  return threads > 0 ? threads : omp_get_max_threads();
#else
  (void)threads;
  return 1;
#endif
}

}  // namespace shardopt_bench
