// bench/src/support.hpp — small helpers every benchmark mode shares: timing, medians, exact gathers of int64 and double over a Communicator, the node a rank runs on, rank-0 printing, thread counts.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <unistd.h>

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

// Every rank's `mine` (the same length on every rank), concatenated in rank order. bf16
// collectives move raw 16-bit words (MPI_UINT16_T, no arithmetic), so four of them carry an
// int64 or a double exactly, which f32 could not.
template <typename T>
std::vector<T> all_gather_exact(Communicator& comm, const std::vector<T>& mine) {
  static_assert(sizeof(T) % 2 == 0, "moved as 16-bit words");
  const std::size_t n = mine.size();
  std::vector<T> all(n * static_cast<std::size_t>(comm.size()));
  if (n == 0) return all;
  T* const own = all.data() + n * static_cast<std::size_t>(comm.rank());
  std::memcpy(own, mine.data(), n * sizeof(T));
  comm.all_gather(own, all.data(), static_cast<int64_t>(n * sizeof(T) / 2), DType::bf16);
  return all;
}

// Every rank's value, in rank order.
inline std::vector<int64_t> gather_int64(Communicator& comm, int64_t value) {
  return all_gather_exact(comm, std::vector<int64_t>{value});
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

// Times `body` (a collective call of every rank) `iters` times after `warmup` untimed calls,
// each between barriers; returns the median of the slowest rank's seconds.
template <typename Body>
double time_collectively(Communicator& comm, int warmup, int iters, const Body& body) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> seconds;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    const auto start = Clock::now();
    body();
    seconds.push_back(seconds_since(start));
    comm.barrier();
  }
  return median(slowest_rank(comm, seconds));
}

// The same number on every rank of one machine, a different one (but for hash collisions) on
// ranks of different machines: which ranks share a memory bus and a last-level cache.
inline int64_t node_id() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const char* c = host; *c != 0; ++c) hash = (hash ^ static_cast<unsigned char>(*c)) * 0x100000001B3ull;
  return static_cast<int64_t>(hash);
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
