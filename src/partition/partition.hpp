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

enum class Strategy : int32_t {
  flat = 0,           // equal contiguous shards of the padded concatenation; params may straddle
  sorted_greedy = 1,  // torch's ZeroRedundancyOptimizer assignment: whole params per rank
  replicated = 2,     // every rank holds everything (the unsharded baseline)
};

struct ParamInfo {
  int64_t numel = 0;
  int32_t group = 0;
  bool trainable = true;
};

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

// flat: trainable params concatenated in registration order, padded to a multiple of
// world*alignment; rank r gets elements [r*S, (r+1)*S) with S = that total / world.
Layout make_flat_layout(const std::vector<ParamInfo>& params, int world, int64_t alignment);

// sorted_greedy: torch's algorithm. Per group (in order), all its params, frozen ones included
// (as torch's _partition_parameters), sorted by numel, largest first (stable), each to the rank
// with the smallest running total (lowest rank on ties); totals carry across groups. Each shard
// holds its trainable params in registration order, unpadded; so freezing a param moves no
// other param to another rank.
Layout make_sorted_greedy_layout(const std::vector<ParamInfo>& params, int world);

// replicated: one shard with everything, identical on every rank.
Layout make_replicated_layout(const std::vector<ParamInfo>& params, int world);

Layout make_layout(Strategy strategy, const std::vector<ParamInfo>& params, int world,
                   int64_t alignment);

// The greedy assignment alone: for each param, its rank (frozen params included).
std::vector<int32_t> sorted_greedy_owners(const std::vector<ParamInfo>& params, int world);

}  // namespace partition
}  // namespace shardopt
