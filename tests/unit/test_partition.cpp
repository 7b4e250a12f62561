// tests/unit/test_partition.cpp — flat and sorted-greedy layouts over many sizes and world sizes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <vector>

#include "partition/partition.hpp"
#include "shardopt/error.hpp"

using shardopt::partition::Layout;
using shardopt::partition::ParamInfo;
using shardopt::partition::Strategy;

namespace {

std::vector<ParamInfo> params_of(const std::vector<int64_t>& sizes, int32_t group = 0) {
  std::vector<ParamInfo> params;
  for (int64_t n : sizes) params.push_back(ParamInfo{n, group, true});
  return params;
}

// Every element of every trainable param is in exactly one shard, at the place the layout says.
void check_covers_every_element(const Layout& layout, const std::vector<ParamInfo>& params) {
  std::vector<std::vector<int>> seen(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) seen[i].assign(static_cast<std::size_t>(params[i].numel), 0);
  for (const auto& shard : layout.shards) {
    int64_t previous_end = 0;
    for (const auto& seg : shard.segments) {
      REQUIRE(seg.length > 0);
      REQUIRE(seg.shard_offset >= previous_end);  // in order, not overlapping
      previous_end = seg.shard_offset + seg.length;
      REQUIRE(previous_end <= shard.numel);
      const auto p = static_cast<std::size_t>(seg.param);
      REQUIRE(params[p].trainable);
      // The flat buffer position agrees with the param's own offset.
      REQUIRE(shard.offset + seg.shard_offset == layout.param_offset[p] + seg.param_offset);
      for (int64_t e = seg.param_offset; e < seg.param_offset + seg.length; ++e) ++seen[p][static_cast<std::size_t>(e)];
    }
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable) {
      REQUIRE(layout.param_offset[i] == -1);
      continue;
    }
    const auto wrong = std::count_if(seen[i].begin(), seen[i].end(), [](int count) { return count != 1; });
    REQUIRE(wrong == 0);
  }
}

// An independent transcription of torch's _partition_parameters, for comparison.
std::vector<int32_t> torch_reference_owners(const std::vector<ParamInfo>& params, int world) {
  std::vector<int64_t> sizes(static_cast<std::size_t>(world), 0);
  std::vector<int32_t> owner(params.size(), -1);
  int32_t max_group = -1;
  for (const auto& p : params) max_group = std::max(max_group, p.group);
  for (int32_t g = 0; g <= max_group; ++g) {
    std::vector<std::size_t> ids;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].group == g && params[i].trainable) ids.push_back(i);
    }
    // sorted(..., key=numel, reverse=True) is stable: equal sizes keep registration order.
    for (std::size_t a = 1; a < ids.size(); ++a) {
      for (std::size_t b = a; b > 0 && params[ids[b - 1]].numel < params[ids[b]].numel; --b) std::swap(ids[b - 1], ids[b]);
    }
    for (std::size_t i : ids) {
      int best = 0;
      for (int r = 1; r < world; ++r) {
        if (sizes[static_cast<std::size_t>(r)] < sizes[static_cast<std::size_t>(best)]) best = r;
      }
      owner[i] = best;
      sizes[static_cast<std::size_t>(best)] += params[i].numel;
    }
  }
  return owner;
}

const std::vector<std::vector<int64_t>> kSizeLists = {
    {},         {0},          {1},           {0, 0, 0},         {1, 1, 1, 1, 1}, {2, 3, 5, 7, 11, 13},
    {17},       {31, 0, 1},   {4097},        {9, 7, 5, 3},      {100, 1, 100},   {1000003},
    {16, 16},   {15, 17, 33}, {65, 0, 127},  {2000 * 20, 2000}, {7, 7, 7, 7, 7, 7, 7, 7, 7},
};

}  // namespace

TEST_CASE("flat layout: equal aligned shards cover every element exactly once", "[partition]") {
  for (const auto& sizes : kSizeLists) {
    const auto params = params_of(sizes);
    const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    for (int world = 1; world <= 33; ++world) {
      CAPTURE(sizes, world);
      const Layout layout = shardopt::partition::make_flat_layout(params, world, 16);
      REQUIRE(layout.shards.size() == static_cast<std::size_t>(world));
      const int64_t per_rank = (total + world - 1) / world;  // ceil(P / N)
      const int64_t expected = (per_rank + 15) / 16 * 16;     // rounded up to the alignment
      REQUIRE(layout.trainable_numel == total);
      REQUIRE(layout.buffer_numel == expected * world);
      for (int r = 0; r < world; ++r) {
        REQUIRE(layout.shards[static_cast<std::size_t>(r)].numel == expected);
        REQUIRE(layout.shards[static_cast<std::size_t>(r)].offset == r * expected);
      }
      check_covers_every_element(layout, params);
    }
  }
}

TEST_CASE("flat layout: a straddling param has no single owner", "[partition]") {
  // 40 elements over 2 ranks with alignment 16: shards of 32; the second param crosses.
  const Layout layout = shardopt::partition::make_flat_layout(params_of({20, 20}), 2, 16);
  REQUIRE(layout.shards[0].numel == 32);
  REQUIRE(layout.param_owner == std::vector<int32_t>{0, -1});
  REQUIRE(layout.shards[0].segments.size() == 2);
  REQUIRE(layout.shards[0].segments[1].length == 12);
  REQUIRE(layout.shards[1].segments.size() == 1);
  REQUIRE(layout.shards[1].segments[0].param_offset == 12);
  REQUIRE(layout.shards[1].segments[0].length == 8);
}

TEST_CASE("flat layout: frozen params are left out", "[partition]") {
  auto params = params_of({10, 5, 10});
  params[1].trainable = false;
  const Layout layout = shardopt::partition::make_flat_layout(params, 2, 1);
  REQUIRE(layout.trainable_numel == 20);
  REQUIRE(layout.shards[0].numel == 10);
  REQUIRE(layout.param_offset == std::vector<int64_t>{0, -1, 10});
  REQUIRE(layout.param_owner == std::vector<int32_t>{0, -1, 1});
  check_covers_every_element(layout, params);
}

TEST_CASE("sorted_greedy: torch's sharding case gives every rank 24 elements", "[partition]") {
  // torch's test_sharding: params of sizes [9, 7, 5, 3] repeated world_size times.
  for (int world = 1; world <= 33; ++world) {
    CAPTURE(world);
    std::vector<int64_t> sizes;
    for (int r = 0; r < world; ++r) sizes.insert(sizes.end(), {9, 7, 5, 3});
    const auto params = params_of(sizes);
    const Layout layout = shardopt::partition::make_sorted_greedy_layout(params, world);
    for (const auto& shard : layout.shards) REQUIRE(shard.numel == 24);
    check_covers_every_element(layout, params);
  }
}

TEST_CASE("sorted_greedy: matches torch's algorithm for many inputs", "[partition]") {
  for (const auto& sizes : kSizeLists) {
    for (int world = 1; world <= 33; ++world) {
      CAPTURE(sizes, world);
      // One group, then the same sizes split over three groups to carry totals across groups.
      std::vector<ParamInfo> grouped = params_of(sizes);
      for (std::size_t i = 0; i < grouped.size(); ++i) grouped[i].group = static_cast<int32_t>(i % 3);
      std::sort(grouped.begin(), grouped.end(), [](const ParamInfo& a, const ParamInfo& b) { return a.group < b.group; });
      for (const auto& params : {params_of(sizes), grouped}) {
        const auto owners = shardopt::partition::sorted_greedy_owners(params, world);
        REQUIRE(owners == torch_reference_owners(params, world));
        const Layout layout = shardopt::partition::make_sorted_greedy_layout(params, world);
        REQUIRE(layout.param_owner == owners);
        int64_t offset = 0;
        for (int r = 0; r < world; ++r) {
          const auto& shard = layout.shards[static_cast<std::size_t>(r)];
          REQUIRE(shard.offset == offset);
          int64_t owned = 0;
          for (std::size_t i = 0; i < params.size(); ++i) owned += owners[i] == r ? params[i].numel : 0;
          REQUIRE(shard.numel == owned);
          offset += shard.numel;
        }
        check_covers_every_element(layout, params);
      }
    }
  }
}

TEST_CASE("sorted_greedy: a known assignment, by hand", "[partition]") {
  // Sorted: 9(p3)->r0, 7(p1)->r1, 5(p2)->r1 (7<9), 3(p0)->r0 (9<12): totals 12 and 12.
  const auto owners = shardopt::partition::sorted_greedy_owners(params_of({3, 7, 5, 9}), 2);
  REQUIRE(owners == std::vector<int32_t>{0, 1, 1, 0});
  // Equal sizes keep registration order; ties go to the lowest rank.
  REQUIRE(shardopt::partition::sorted_greedy_owners(params_of({4, 4, 4}), 2) == std::vector<int32_t>{0, 1, 0});
  // A later group continues from the totals of the earlier one.
  std::vector<ParamInfo> two_groups = params_of({10, 1});
  two_groups.push_back(ParamInfo{6, 1, true});
  REQUIRE(shardopt::partition::sorted_greedy_owners(two_groups, 2) == std::vector<int32_t>{0, 1, 1});
}

TEST_CASE("replicated layout: every rank holds everything", "[partition]") {
  const auto params = params_of({3, 0, 5});
  const Layout layout = shardopt::partition::make_replicated_layout(params, 4);
  REQUIRE(layout.shards.size() == 4);
  for (const auto& shard : layout.shards) {
    REQUIRE(shard.offset == 0);
    REQUIRE(shard.numel == 8);
    REQUIRE(shard.segments.size() == 2);
  }
}

TEST_CASE("partition rejects nonsense", "[partition]") {
  REQUIRE_THROWS_WITH(shardopt::partition::make_flat_layout(params_of({1}), 0, 16),
                      Catch::Contains("world size must be in [1, 16777216], got 0"));
  REQUIRE_THROWS_WITH(shardopt::partition::make_sorted_greedy_layout(params_of({-1}), 2),
                      Catch::Contains("parameter #0 has numel -1, outside [0, 72057594037927936]"));
}

TEST_CASE("layouts refuse counts beyond 2^56 elements instead of wrapping", "[partition]") {
  using shardopt::partition::make_layout;
  const int64_t limit = shardopt::partition::kMaxElements;
  auto refused = [](auto&& call) {
    try {
      call();
    } catch (const shardopt::Error& e) {
      REQUIRE(e.code() == shardopt::ErrorCode::invalid_argument);
      return std::string(e.what());
    }
    FAIL("no shardopt::Error was thrown");
    return std::string();
  };
  for (Strategy s : {Strategy::flat, Strategy::sorted_greedy, Strategy::replicated}) {
    REQUIRE_THAT(refused([&] { make_layout(s, params_of({8, INT64_MAX}), 2, 16); }),
                 Catch::Contains("parameter #1 has numel 9223372036854775807, outside [0, 72057594037927936]"));
    // Four of 2^62 plus 16 summed to 16 in int64: each is refused on its own now.
    REQUIRE_THAT(refused([&] { make_layout(s, params_of({int64_t{1} << 62, int64_t{1} << 62, 16}), 2, 16); }),
                 Catch::Contains("parameter #0 has numel 4611686018427387904"));
    REQUIRE_THAT(refused([&] { make_layout(s, params_of({limit, 1}), 1, 1); }),
                 Catch::Contains("parameters #0..#1 hold 72057594037927937 elements in all"));
  }
  // Padding counts: exactly 2^56 elements fit, padded past it they do not.
  REQUIRE(make_layout(Strategy::flat, params_of({limit}), 4, 16).buffer_numel == limit);
  REQUIRE_THAT(refused([&] { make_layout(Strategy::flat, params_of({limit - 1}), 3, 16); }),
               Catch::Contains("padded to a multiple of 3 ranks x alignment 16, holds 72057594037927968"));
  REQUIRE_THAT(refused([&] { make_layout(Strategy::flat, params_of({8}), 2, 3); }),
               Catch::Contains("alignment must be a power of two in [1, 1048576], got 3"));
  REQUIRE_THAT(refused([&] { make_layout(Strategy::flat, params_of({8}), (1 << 24) + 1, 16); }),
               Catch::Contains("world size must be in [1, 16777216], got 16777217"));
}

TEST_CASE("whole params (Muon matrices) sit whole in their owner's shard, by cost, every param contiguous",
          "[partition][muon]") {
  using shardopt::partition::newton_schulz_cost;
  // Vectors (some larger than a flat shard) between matrices of different costs, one frozen.
  std::vector<ParamInfo> params = params_of({37, 0, 300, 5, 64, 1, 129, 16, 90});
  const std::vector<std::pair<int, std::pair<int64_t, int64_t>>> matrices = {
      {2, {20, 15}}, {4, {8, 8}}, {6, {3, 43}}, {8, {9, 10}}};
  for (const auto& [index, shape] : matrices) {
    params[static_cast<std::size_t>(index)].whole = true;
    params[static_cast<std::size_t>(index)].cost = newton_schulz_cost(shape.first, shape.second, 5);
  }
  params[8].trainable = false;  // a frozen matrix is assigned (so freezing moves no other), not placed
  for (int world = 1; world <= 5; ++world) {
    const std::vector<int32_t> owners = shardopt::partition::whole_matrix_owners(params, world);
    // The rule by hand: largest cost first to the least-loaded rank.
    std::vector<std::size_t> order = {2, 4, 6, 8};
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return params[a].cost > params[b].cost; });
    std::vector<double> load(static_cast<std::size_t>(world), 0.0);
    for (std::size_t i : order) {
      const auto least = std::min_element(load.begin(), load.end());
      REQUIRE(owners[i] == static_cast<int32_t>(least - load.begin()));
      *least += params[i].cost;
    }
    for (Strategy strategy : {Strategy::flat, Strategy::sorted_greedy}) {
      CAPTURE(world, static_cast<int>(strategy));
      const Layout layout = shardopt::partition::make_layout(strategy, params, world, 16);
      std::vector<int64_t> covered(params.size(), 0);
      for (int r = 0; r < world; ++r) {
        const auto& shard = layout.shards[static_cast<std::size_t>(r)];
        if (strategy == Strategy::flat) REQUIRE(shard.numel == layout.shards[0].numel);  // shards stay equal
        for (const auto& s : shard.segments) {
          const auto i = static_cast<std::size_t>(s.param);
          // No param is split, so its view [param_offset, +numel) is this one piece.
          REQUIRE(s.param_offset == 0);
          REQUIRE(s.length == params[i].numel);
          REQUIRE(layout.param_offset[i] == shard.offset + s.shard_offset);
          if (params[i].whole) REQUIRE(owners[i] == r);
          covered[i] += s.length;
        }
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        REQUIRE(covered[i] == (params[i].trainable ? params[i].numel : 0));
        if (params[i].whole) REQUIRE(layout.param_owner[i] == owners[i]);
      }
    }
  }
}
