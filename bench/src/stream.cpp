// bench/src/stream.cpp — runs the bandwidth kernels with every rank streaming at once and reports the best repetition, as STREAM does.
#include "stream.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "support.hpp"
#include "cpu/stream_cpu.hpp"  // kernels/: the probes, dispatched like the update kernels
#include "precision.hpp"       // kernels/: bf16 <-> float, for reading a 16-bit result

namespace shardopt_bench {

using shardopt::kernels::fill_cpu;
using shardopt::kernels::stream_copy_cpu;
using shardopt::kernels::stream_triad_cpu;
using shardopt::kernels::update_pattern_cpu;
using shardopt::kernels::update_pattern_half_cpu;
using shardopt::kernels::UpdatePattern;

namespace {

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using AlignedArray = std::unique_ptr<float, AlignedFree>;

AlignedArray aligned_floats(int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedArray(static_cast<float*>(p));
}

}  // namespace

double StreamResult::best_gbps() const { return std::max({copy_gbps, triad_gbps, update_gbps}); }

const char* StreamResult::best_pattern() const {
  const double best = best_gbps();
  return best == update_gbps ? "update" : best == triad_gbps ? "triad" : "copy";
}

StreamResult measure_stream(Communicator& comm, int threads, int64_t array_bytes, UpdateShape shape, DType dtype, int reps) {
  StreamResult result;
  result.array_bytes = array_bytes;
  const int64_t n = result.array_bytes / static_cast<int64_t>(sizeof(float));
  // Each array starts at another offset within its pages (i * 4160 bytes): large allocations
  // are page-aligned mmaps, and arrays at equal offsets walk the same cache sets and DRAM banks
  // in lockstep, which slows the probes below what the kernels reach over the optimizer's
  // buffers (whose sizes are not powers of two).
  constexpr int64_t kStagger = 1040;  // floats
  AlignedArray owners[4] = {aligned_floats(n), aligned_floats(n + kStagger), aligned_floats(n + 2 * kStagger),
                            aligned_floats(n + 3 * kStagger)};
  float* const a = owners[0].get();
  float* const b = owners[1].get() + kStagger;
  float* const c = owners[2].get() + 2 * kStagger;
  float* const d = owners[3].get() + 3 * kStagger;
  // 16-bit gradient and parameter arrays (mixed precision only).
  const bool half = dtype != DType::f32;
  AlignedArray half_owners[2] = {aligned_floats(half ? (n + 1) / 2 : 1), aligned_floats(half ? (n + 1) / 2 : 1)};
  auto* const g16 = reinterpret_cast<uint16_t*>(half_owners[0].get());
  auto* const p16 = reinterpret_cast<uint16_t*>(half_owners[1].get());
  // First touch by the kernels' own thread split, so each thread's pages are where it runs.
  // Values stay normal floats through every kernel (no denormal slow paths).
  fill_cpu(a, 1.0f, n, threads);
  fill_cpu(b, 2.0f, n, threads);
  fill_cpu(c, 0.5f, n, threads);
  fill_cpu(d, 0.25f, n, threads);
  if (half) {
    fill_cpu(g16, uint16_t{0x4000}, n, threads);  // 2.0 as bf16, as b
    fill_cpu(p16, uint16_t{0}, n, threads);
  }
  const UpdatePattern pattern = shape == UpdateShape::adam           ? UpdatePattern::adam
                                : shape == UpdateShape::sgd_momentum ? UpdatePattern::sgd_momentum
                                                                     : UpdatePattern::sgd;
  const int repetitions = std::max(2, reps);
  std::vector<double> copy_s, triad_s, update_s;
  auto timed = [&](std::vector<double>& out, const auto& kernel) {
    comm.barrier();
    const auto start = Clock::now();
    kernel();
    out.push_back(seconds_since(start));
  };
  for (int rep = 0; rep < repetitions; ++rep) {
    timed(copy_s, [&] { stream_copy_cpu(a, c, n, threads); });
    timed(triad_s, [&] { stream_triad_cpu(a, b, c, 3.0f, n, threads); });
    // p = a, g = b, m = c, v = d; mixed precision: master = a, g = g16, p = p16.
    timed(update_s, [&] {
      if (half) {
        update_pattern_half_cpu(pattern, a, g16, p16, c, d, n, threads);
      } else {
        update_pattern_cpu(pattern, a, b, c, d, n, threads);
      }
    });
  }
  // The results are read, so the loops cannot be dropped as dead stores.
  volatile float sink = a[n / 2] + c[n / 3] + d[n / 5] + (half ? shardopt::kernels::bf16_to_float(p16[n / 7]) : 0.f);
  (void)sink;
  // The first repetition also pays for warming TLBs and the thread team; STREAM skips it.
  auto best_gbps = [&](const std::vector<double>& seconds, int64_t bytes_per_element) {
    const std::vector<double> slowest = slowest_rank(comm, seconds);
    const double best = *std::min_element(slowest.begin() + 1, slowest.end());
    return static_cast<double>(comm.size()) * static_cast<double>(n) * static_cast<double>(bytes_per_element) / best / 1e9;
  };
  result.copy_gbps = best_gbps(copy_s, 8);
  result.triad_gbps = best_gbps(triad_s, 12);
  result.update_gbps = best_gbps(update_s, update_bytes_per_param(shape, dtype));
  return result;
}

}  // namespace shardopt_bench
