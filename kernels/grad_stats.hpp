// kernels/grad_stats.hpp — the fixed order in which grad_stats sums squares (or takes the max), shared by the CPU loop and the CUDA kernels.
//
// Order, depending on n only: elements in chunks of kStatsChunk; within a chunk, lane j of
// kStatsLanes sums elements j, j+32, j+64, ... in turn (starting from 0), then the lanes are
// folded by a halving tree (lane j += lane j+16 for j < 16, then +8, +4, +2, +1). Chunk sums
// are added in order (from 0) within groups of chunks_per_group consecutive chunks, and the
// group sums in order (from 0). On the GPU a warp owns a chunk (its lanes are the 32 lanes,
// the tree is a shuffle-down reduction) and a block owns a group, so the number of partials
// the device keeps is bounded by kStatsMaxGroups. The CPU runs chunks on any number of threads
// and then adds them in the same order: the result is the same bits everywhere.
#pragma once

#include <cstdint>
#include <limits>

#include "precision.hpp"

namespace shardopt {
namespace kernels {

constexpr int64_t kStatsChunk = 4096;
constexpr int kStatsLanes = 32;
constexpr int64_t kStatsMaxGroups = 1024;

struct StatsShape {
  int64_t chunks = 0;
  int64_t chunks_per_group = 1;
  int64_t groups = 0;
};

SHARDOPT_HOST_DEVICE StatsShape stats_shape(int64_t n) {
  StatsShape shape;
  if (n <= 0) return shape;
  shape.chunks = (n + kStatsChunk - 1) / kStatsChunk;
  shape.chunks_per_group = (shape.chunks + kStatsMaxGroups - 1) / kStatsMaxGroups;
  shape.groups = (shape.chunks + shape.chunks_per_group - 1) / shape.chunks_per_group;
  return shape;
}

// Inf or NaN, from the exponent bits (valid under any floating-point flags).
SHARDOPT_HOST_DEVICE uint32_t nonfinite_bit(float x) {
  return (float_bits(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
}

// One step of the reduction: a sum, or a max in which NaN never wins (NaNs are reported by
// the nonfinite flag instead), so the max does not depend on the order either.
template <bool kInfNorm>
SHARDOPT_HOST_DEVICE double stats_combine(double acc, double x) {
  if (kInfNorm) return x > acc ? x : acc;
  return acc + x;
}

// What one element contributes: its square, or its magnitude, after unscaling in float.
template <bool kInfNorm>
SHARDOPT_HOST_DEVICE double stats_term(float g) {
  const double d = static_cast<double>(g);
  if (kInfNorm) return d < 0.0 ? -d : d;
  return d * d;  // exact: 24-bit significands square into 48 bits
}

// The reported value: a NaN sum (some element was NaN) as the one canonical quiet NaN. Which
// NaN an addition of two NaNs propagates depends on the operand order inside the instruction,
// which the compiler picks differently for each ISA; the flag `nonfinite` says what happened.
// Host only (the CPU kernels).
inline double stats_result(double total) {
  return total != total ? std::numeric_limits<double>::quiet_NaN() : total;
}

// The lanes' halving tree, in place; the result is lanes[0].
template <bool kInfNorm>
SHARDOPT_HOST_DEVICE double stats_fold_lanes(double* lanes) {
  for (int width = kStatsLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] = stats_combine<kInfNorm>(lanes[j], lanes[j + width]);
  }
  return lanes[0];
}

// One chunk of `len` (<= kStatsChunk) elements in the order above; ORs the nonfinite flag into
// *nonfinite. Written for the host's vectoriser: the lane loop maps onto vector registers.
template <typename Format, bool kInfNorm>
SHARDOPT_HOST_DEVICE double stats_chunk(const typename Format::Storage* x, int64_t len, float unscale,
                                        uint32_t* nonfinite) {
  double lanes[kStatsLanes];
  uint32_t flags[kStatsLanes];
  for (int j = 0; j < kStatsLanes; ++j) {
    lanes[j] = 0.0;
    flags[j] = 0u;
  }
  const int64_t full = len / kStatsLanes * kStatsLanes;
  for (int64_t k = 0; k < full; k += kStatsLanes) {
    for (int j = 0; j < kStatsLanes; ++j) {
      const float g = Format::widen(x[k + j]) * unscale;
      flags[j] |= nonfinite_bit(g);
      lanes[j] = stats_combine<kInfNorm>(lanes[j], stats_term<kInfNorm>(g));
    }
  }
  for (int j = 0; j < static_cast<int>(len - full); ++j) {
    const float g = Format::widen(x[full + j]) * unscale;
    flags[j] |= nonfinite_bit(g);
    lanes[j] = stats_combine<kInfNorm>(lanes[j], stats_term<kInfNorm>(g));
  }
  uint32_t any = 0u;
  for (int j = 0; j < kStatsLanes; ++j) any |= flags[j];
  *nonfinite |= any;
  return stats_fold_lanes<kInfNorm>(lanes);
}

}  // namespace kernels
}  // namespace shardopt
