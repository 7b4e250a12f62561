// src/averaging/averaging_schedule.hpp — which steps average over which groups: torch's averager rules and their validation.
#pragma once

#include <cstdint>

#include "shardopt/averaging.hpp"

namespace shardopt {
namespace averaging {

// `config` with every group size resolved (0: the world), after torch's checks and ours
// (Error(invalid_argument) with torch's wording where torch has one; see averaging.hpp).
AveragerConfig validated_config(AveragerConfig config, int world_size);

// The level whose groups average at `step`, or -1 when none does (torch's rule: periodic counts
// from warmup, hierarchical from 0, the largest period dividing wins).
int level_at(const AveragerConfig& config, int64_t step);

}  // namespace averaging
}  // namespace shardopt
