// src/partition/partition.hpp — pure functions from registered params to a Layout of per-rank shards.
//
// A Layout places every trainable parameter in one flat buffer made of the ranks' shards in
// rank order: shard r occupies [shards[r].offset, shards[r].offset + shards[r].numel). Each
// shard lists the pieces of parameters (segments) it holds. Frozen params are not placed.
#pragma once

#include <cstdint>
#include <vector>

namespace shardopt {
namespace partition {

// The most elements one parameter, all of them together, or a padded flat buffer may hold:
// 2^56 (256 PiB of floats). Bytes of any buffer over such counts (at most 8 bytes an element,
// times the few buffers of a layout) stay far inside int64, and so do sums of offsets, so the
// layout and everything indexing it need no further overflow checks. Larger counts are
// refused with Error(invalid_argument) naming the parameter.
constexpr int64_t kMaxElements = int64_t{1} << 56;
// The largest world and alignment a layout takes: their product stays far below kMaxElements.
constexpr int kMaxWorld = 1 << 24;
constexpr int64_t kMaxAlignment = int64_t{1} << 20;

enum class Strategy : int32_t {
  flat = 0,           // equal contiguous shards of the padded concatenation; params may straddle
  sorted_greedy = 1,  // torch's ZeroRedundancyOptimizer assignment: whole params per rank
  replicated = 2,     // every rank holds everything (the unsharded baseline)
};

struct ParamInfo {
  int64_t numel = 0;
  int32_t group = 0;
  bool trainable = true;
  // A matrix whose update needs all of it (Muon): owned whole by one rank whatever the
  // strategy (not under replicated, where every rank holds everything), assigned by `cost`.
  bool whole = false;
  double cost = 0.0;  // the work of its update (Muon: the Newton-Schulz flops)
};

// Muon's Newton-Schulz flops for a rows x cols matrix: ns_steps * (4 m n min(m, n) + 2 min(m, n)^3)
// (in double: exact for every matrix a layout holds up to 2^53, monotone beyond).
double newton_schulz_cost(int64_t rows, int64_t cols, int ns_steps);

// Owners of the whole params (whole = true, frozen ones included, so that freezing one moves no
// other): largest cost first (stable: registration order on ties) to the rank with the least
// cost so far (lowest rank on ties). -1 for the other params.
std::vector<int32_t> whole_matrix_owners(const std::vector<ParamInfo>& params, int world);

// Elements of `params` that are trainable (placed in the flat buffer) plus, with
// `frozen_too`, the frozen ones; Error(invalid_argument) naming the first parameter whose numel
// is negative or above kMaxElements, or at which the running sum passes kMaxElements.
int64_t checked_total_numel(const std::vector<ParamInfo>& params, bool frozen_too);

// A contiguous piece of one parameter inside a shard.
struct Segment {
  int32_t param = 0;
  int64_t param_offset = 0;  // first element of the piece within the parameter
  int64_t shard_offset = 0;  // where the piece starts within the shard
  int64_t length = 0;
};

struct RankShard {
  int64_t offset = 0;  // start of the shard in the flat buffer
  int64_t numel = 0;   // elements, padding included (all ranks equal under flat)
  std::vector<Segment> segments;
};

struct Layout {
  Strategy strategy = Strategy::flat;
  int world = 1;
  int64_t alignment = 1;
  std::vector<RankShard> shards;  // one per rank
  int64_t buffer_numel = 0;       // total flat buffer (replicated: one copy)
  int64_t trainable_numel = 0;
  // Per parameter: its first element in the flat buffer (-1 when frozen), and the rank that
  // holds all of it: sorted_greedy, torch's owner of every param, frozen ones included (a frozen
  // param is assigned but not placed); flat, -1 when frozen or split across ranks; replicated, -1.
  std::vector<int64_t> param_offset;
  std::vector<int32_t> param_owner;
};

// Every make_*_layout checks its inputs (world in [1, kMaxWorld], alignment a power of two up
// to kMaxAlignment, numels as checked_total_numel, the padded buffer within kMaxElements).
//
// flat: trainable params concatenated in registration order, padded to a multiple of
// world*alignment; rank r gets elements [r*S, (r+1)*S) with S = that total / world. With whole
// params (Muon) among them no param is split, so that every param stays contiguous in the
// buffer while each matrix sits whole in its owner's shard: the other params each go to the
// rank whose [r*S, (r+1)*S) holds their first element (S over them alone), the whole ones to
// whole_matrix_owners' ranks; a shard holds its params in registration order, the whole ones
// last, and every shard is padded to the largest one's multiple of the alignment.
Layout make_flat_layout(const std::vector<ParamInfo>& params, int world, int64_t alignment);

// sorted_greedy: torch's algorithm. Per group (in order), all its params, frozen ones included
// (as torch's _partition_parameters), sorted by numel, largest first (stable), each to the rank
// with the smallest running total (lowest rank on ties); totals carry across groups. Each shard
// holds its trainable params in registration order, unpadded; so freezing a param moves no
// other param to another rank. Whole params take no part in those totals: they go to
// whole_matrix_owners' ranks.
Layout make_sorted_greedy_layout(const std::vector<ParamInfo>& params, int world);

// replicated: one shard with everything, identical on every rank.
Layout make_replicated_layout(const std::vector<ParamInfo>& params, int world);

Layout make_layout(Strategy strategy, const std::vector<ParamInfo>& params, int world,
                   int64_t alignment);

// The greedy assignment alone: for each param, its rank (frozen params included).
std::vector<int32_t> sorted_greedy_owners(const std::vector<ParamInfo>& params, int world);

}  // namespace partition
}  // namespace shardopt
