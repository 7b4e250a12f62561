// src/partition/partition.cpp — flat, sorted-greedy and replicated layouts.
#include "partition/partition.hpp"

#include <algorithm>
#include <numeric>

#include "core/check.hpp"

namespace shardopt {
namespace partition {
namespace {

void check_inputs(const std::vector<ParamInfo>& params, int world) {
  SHARDOPT_CHECK(world >= 1 && world <= kMaxWorld, invalid_argument, "world size must be in [1, {}], got {}",
                 kMaxWorld, world);
  checked_total_numel(params, /*frozen_too=*/true);
}

Layout empty_layout(Strategy strategy, const std::vector<ParamInfo>& params, int world,
                    int64_t alignment) {
  Layout layout;
  layout.strategy = strategy;
  layout.world = world;
  layout.alignment = alignment;
  layout.shards.resize(static_cast<std::size_t>(world));
  layout.param_offset.assign(params.size(), -1);
  layout.param_owner.assign(params.size(), -1);
  return layout;
}

// Cuts the concatenation [0, total) of trainable params into shards by rank.
void fill_contiguous_segments(const std::vector<ParamInfo>& params, Layout& layout) {
  int64_t cursor = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable) continue;
    layout.param_offset[i] = cursor;
    const int64_t end = cursor + params[i].numel;
    int32_t owner = -1;
    for (int r = 0; r < layout.world && params[i].numel > 0; ++r) {
      RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      const int64_t lo = std::max(cursor, shard.offset);
      const int64_t hi = std::min(end, shard.offset + shard.numel);
      if (lo >= hi) continue;
      shard.segments.push_back(Segment{static_cast<int32_t>(i), lo - cursor, lo - shard.offset, hi - lo});
      owner = (lo == cursor && hi == end) ? r : -1;
    }
    layout.param_owner[i] = owner;
    cursor = end;
  }
}

}  // namespace

int64_t checked_total_numel(const std::vector<ParamInfo>& params, bool frozen_too) {
  int64_t total = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel;
    SHARDOPT_CHECK(n >= 0 && n <= kMaxElements, invalid_argument,
                   "parameter #{} has numel {}, outside [0, {}] (2^56, the most elements shardopt lays out)", i, n,
                   kMaxElements);
    if (!frozen_too && !params[i].trainable) continue;
    // Both terms are within [0, 2^56]: the sum cannot overflow before it is compared.
    total += n;
    SHARDOPT_CHECK(total <= kMaxElements, invalid_argument,
                   "parameters #0..#{} hold {} elements in all, more than {} (2^56, the most shardopt lays out)", i,
                   total, kMaxElements);
  }
  return total;
}

double newton_schulz_cost(int64_t rows, int64_t cols, int ns_steps) {
  const double m = static_cast<double>(rows);
  const double n = static_cast<double>(cols);
  const double k = std::min(m, n);
  return static_cast<double>(ns_steps) * (4.0 * m * n * k + 2.0 * k * k * k);
}

std::vector<int32_t> whole_matrix_owners(const std::vector<ParamInfo>& params, int world) {
  check_inputs(params, world);
  std::vector<int32_t> owner(params.size(), -1);
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].whole) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return params[a].cost > params[b].cost; });
  std::vector<double> load(static_cast<std::size_t>(world), 0.0);
  for (std::size_t i : order) {
    const auto least = std::min_element(load.begin(), load.end());  // first minimum: lowest rank
    owner[i] = static_cast<int32_t>(least - load.begin());
    *least += params[i].cost;
  }
  return owner;
}

Layout make_flat_layout(const std::vector<ParamInfo>& params, int world, int64_t alignment) {
  check_inputs(params, world);
  SHARDOPT_CHECK(alignment >= 1 && alignment <= kMaxAlignment && (alignment & (alignment - 1)) == 0, invalid_argument,
                 "alignment must be a power of two in [1, {}], got {}", kMaxAlignment, alignment);
  Layout layout = empty_layout(Strategy::flat, params, world, alignment);
  const bool any_whole = std::any_of(params.begin(), params.end(), [](const ParamInfo& p) { return p.whole; });
  if (any_whole) {
    // Whole params: a param is never split between ranks here, so that every param stays
    // contiguous in the buffer (its view) while each rank's matrices sit inside its shard. The
    // other params go to the rank where the flat cut would have begun them; then each shard
    // holds those, then its whole params, in registration order, padded to the largest.
    const int64_t rest_total = checked_total_numel(params, /*frozen_too=*/false);
    const int64_t quantum = alignment * world;
    const int64_t flat_part = (rest_total + quantum - 1) / quantum * quantum / world;
    const std::vector<int32_t> whole_owner = whole_matrix_owners(params, world);
    std::vector<int32_t> owner(params.size(), -1);
    std::vector<int64_t> used(static_cast<std::size_t>(world), 0);
    int64_t cursor = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable || params[i].whole) continue;
      owner[i] = static_cast<int32_t>(std::min<int64_t>(world - 1, flat_part == 0 ? 0 : cursor / flat_part));
      cursor += params[i].numel;
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].whole) owner[i] = whole_owner[i];
      if (params[i].trainable && owner[i] >= 0) used[static_cast<std::size_t>(owner[i])] += params[i].numel;
    }
    const int64_t widest = *std::max_element(used.begin(), used.end());
    const int64_t shard_numel = (widest + alignment - 1) / alignment * alignment;
    SHARDOPT_CHECK(shard_numel <= kMaxElements / world, invalid_argument,
                   "the flat buffer of {} ranks x {} elements (whole matrices are not split) holds more than {} (2^56)",
                   world, shard_numel, kMaxElements);
    std::vector<int64_t> fill(static_cast<std::size_t>(world), 0);
    for (int r = 0; r < world; ++r) {
      layout.shards[static_cast<std::size_t>(r)].offset = r * shard_numel;
      layout.shards[static_cast<std::size_t>(r)].numel = shard_numel;
    }
    for (bool whole_pass : {false, true}) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (params[i].whole != whole_pass) continue;
        layout.param_owner[i] = owner[i];  // whole ones frozen too, as sorted_greedy assigns them
        if (!params[i].trainable) continue;
        const std::size_t r = static_cast<std::size_t>(owner[i]);
        RankShard& shard = layout.shards[r];
        layout.param_offset[i] = shard.offset + fill[r];
        if (params[i].numel > 0) shard.segments.push_back(Segment{static_cast<int32_t>(i), 0, fill[r], params[i].numel});
        fill[r] += params[i].numel;
      }
    }
    layout.buffer_numel = shard_numel * world;
    layout.trainable_numel = rest_total;
    return layout;
  }
  const int64_t total = checked_total_numel(params, /*frozen_too=*/false);
  // quantum <= 2^44 and total <= 2^56: the rounding below cannot overflow.
  const int64_t quantum = alignment * world;
  const int64_t padded = (total + quantum - 1) / quantum * quantum;
  SHARDOPT_CHECK(padded <= kMaxElements, invalid_argument,
                 "the flat buffer of {} elements, padded to a multiple of {} ranks x alignment {}, holds {}: more than "
                 "{} (2^56)",
                 total, world, alignment, padded, kMaxElements);
  const int64_t shard_numel = padded / world;
  for (int r = 0; r < world; ++r) {
    layout.shards[static_cast<std::size_t>(r)].offset = r * shard_numel;
    layout.shards[static_cast<std::size_t>(r)].numel = shard_numel;
  }
  layout.buffer_numel = padded;
  layout.trainable_numel = total;
  fill_contiguous_segments(params, layout);
  return layout;
}

std::vector<int32_t> sorted_greedy_owners(const std::vector<ParamInfo>& params, int world) {
  check_inputs(params, world);
  std::vector<int32_t> owner(params.size(), -1);
  std::vector<int64_t> totals(static_cast<std::size_t>(world), 0);
  // Groups in order of first appearance (ids are registration order, groups are appended).
  std::vector<int32_t> groups;
  for (const ParamInfo& p : params) {
    if (std::find(groups.begin(), groups.end(), p.group) == groups.end()) groups.push_back(p.group);
  }
  for (int32_t group : groups) {
    std::vector<std::size_t> members;
    for (std::size_t i = 0; i < params.size(); ++i) {
      // torch's _partition_parameters assigns every param of the group, trainable or not;
      // whole matrices go by their cost instead (below).
      if (params[i].group == group && !params[i].whole) members.push_back(i);
    }
    std::stable_sort(members.begin(), members.end(), [&](std::size_t a, std::size_t b) {
      return params[a].numel > params[b].numel;
    });
    for (std::size_t i : members) {
      const auto smallest = std::min_element(totals.begin(), totals.end());  // first minimum
      owner[i] = static_cast<int32_t>(smallest - totals.begin());
      *smallest += params[i].numel;
    }
  }
  const std::vector<int32_t> whole = whole_matrix_owners(params, world);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].whole) owner[i] = whole[i];
  }
  return owner;
}

Layout make_sorted_greedy_layout(const std::vector<ParamInfo>& params, int world) {
  Layout layout = empty_layout(Strategy::sorted_greedy, params, world, 1);
  const std::vector<int32_t> owner = sorted_greedy_owners(params, world);
  for (std::size_t i = 0; i < params.size(); ++i) {
    layout.param_owner[i] = owner[i];
    if (!params[i].trainable) continue;  // owned as torch assigns it, but never updated: no place
    RankShard& shard = layout.shards[static_cast<std::size_t>(owner[i])];
    layout.param_offset[i] = shard.numel;  // within the shard for now; made absolute below
    if (params[i].numel > 0) {
      shard.segments.push_back(Segment{static_cast<int32_t>(i), 0, shard.numel, params[i].numel});
    }
    shard.numel += params[i].numel;
  }
  int64_t cursor = 0;
  for (RankShard& shard : layout.shards) {
    shard.offset = cursor;
    cursor += shard.numel;
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].trainable) layout.param_offset[i] += layout.shards[static_cast<std::size_t>(owner[i])].offset;
  }
  layout.buffer_numel = cursor;
  layout.trainable_numel = cursor;
  return layout;
}

Layout make_replicated_layout(const std::vector<ParamInfo>& params, int world) {
  check_inputs(params, world);
  Layout layout = empty_layout(Strategy::replicated, params, world, 1);
  int64_t total = 0;
  for (const ParamInfo& p : params) total += p.trainable ? p.numel : 0;
  // Every rank's shard is the whole buffer; only rank 0's segments are built, then copied.
  layout.shards.assign(1, RankShard{0, total, {}});
  layout.world = 1;
  fill_contiguous_segments(params, layout);
  layout.world = world;
  layout.shards.resize(static_cast<std::size_t>(world), layout.shards[0]);
  std::fill(layout.param_owner.begin(), layout.param_owner.end(), -1);
  layout.buffer_numel = total;
  layout.trainable_numel = total;
  return layout;
}

Layout make_layout(Strategy strategy, const std::vector<ParamInfo>& params, int world,
                   int64_t alignment) {
  switch (strategy) {
    case Strategy::flat: return make_flat_layout(params, world, alignment);
    case Strategy::sorted_greedy: return make_sorted_greedy_layout(params, world);
    case Strategy::replicated: return make_replicated_layout(params, world);
  }
  raise(ErrorCode::invalid_argument, "unknown partition strategy {}", static_cast<int>(strategy));
}

}  // namespace partition
}  // namespace shardopt
