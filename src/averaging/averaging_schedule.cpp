// src/averaging/averaging_schedule.cpp — torch's averager validation and step rules.
#include "averaging/averaging_schedule.hpp"

#include <cmath>

#include "core/check.hpp"

namespace shardopt {

AveragerConfig periodic_averager(int64_t period, int64_t warmup_steps) {
  AveragerConfig config;
  config.levels = {AveragingLevel{period, 0}};
  config.warmup_steps = warmup_steps;
  return config;
}

AveragerConfig hierarchical_averager(std::vector<AveragingLevel> levels, int64_t warmup_steps) {
  AveragerConfig config;
  config.levels = std::move(levels);
  config.warmup_steps = warmup_steps;
  config.hierarchical = true;
  return config;
}

namespace averaging {

AveragerConfig validated_config(AveragerConfig config, int world_size) {
  const bool periodic = !config.hierarchical;
  // torch's own messages first, in torch's order.
  if (periodic) {
    SHARDOPT_CHECK(config.warmup_steps >= 0, invalid_argument,
                   "PeriodicModelAverager: Arg ``warmup_steps`` must be a non-negative number (got {}).",
                   config.warmup_steps);
    SHARDOPT_CHECK(config.levels.size() == 1, invalid_argument,
                   "PeriodicModelAverager: exactly one level (period, group size 0) expected, got {}",
                   config.levels.size());
    SHARDOPT_CHECK(config.levels[0].period >= 1, invalid_argument,
                   "PeriodicModelAverager: Arg ``period`` must be a positive value (got {}).", config.levels[0].period);
  } else {
    SHARDOPT_CHECK(!config.levels.empty(), invalid_argument,
                   "HierarchicalModelAverager: Arg ``period_group_size_dict`` must not be empty.");
    SHARDOPT_CHECK(config.levels.front().period > 0, invalid_argument,
                   "HierarchicalModelAverager: The minimum period in arg ``period_group_size_dict`` must be a positive "
                   "value (got {}).",
                   config.levels.front().period);
  }
  for (AveragingLevel& level : config.levels) {
    if (level.group_size == 0) level.group_size = world_size;
  }
  if (!periodic) {
    const int last = config.levels.back().group_size;
    SHARDOPT_CHECK(last == world_size, invalid_argument,
                   "HierarchicalModelAverager: The last value in arg ``period_group_size_dict`` {} must be equal to "
                   "the size of arg ``process_group`` {}.",
                   last, world_size);
  }
  const char* who = periodic ? "PeriodicModelAverager" : "HierarchicalModelAverager";
  for (std::size_t i = 0; i < config.levels.size(); ++i) {
    const AveragingLevel& level = config.levels[i];
    // dist.new_subgroups(group_size)'s checks.
    SHARDOPT_CHECK(level.group_size > 0, invalid_argument, "{}: The arg 'group_size' ({}) must be positive", who,
                   level.group_size);
    SHARDOPT_CHECK(level.group_size <= world_size, invalid_argument,
                   "{}: The arg 'group_size' ({}) must not exceed the world size ({})", who, level.group_size,
                   world_size);
    SHARDOPT_CHECK(world_size % level.group_size == 0, invalid_argument,
                   "{}: The world size ({}) must be divisible by 'group_size={}'", who, world_size, level.group_size);
    if (i > 0) {
      const AveragingLevel& lower = config.levels[i - 1];
      SHARDOPT_CHECK(level.period > lower.period && level.group_size > lower.group_size, invalid_argument,
                     "{}: periods and group sizes must increase from level to level: ({} steps, {} ranks) follows "
                     "({} steps, {} ranks)",
                     who, level.period, level.group_size, lower.period, lower.group_size);
    }
  }
  if (!periodic) {
    SHARDOPT_CHECK(config.warmup_steps >= 0, invalid_argument,
                   "HierarchicalModelAverager: Arg ``warmup_steps`` must be a non-negative number (got {}).",
                   config.warmup_steps);
  }
  SHARDOPT_CHECK(config.bucket_bytes >= 64, invalid_argument,
                 "{}: bucket_bytes must be at least 64, got {}", who, config.bucket_bytes);
  const OuterOptimizer& outer = config.outer;
  if (outer.enabled) {
    SHARDOPT_CHECK(std::isfinite(outer.lr) && outer.lr > 0.0, invalid_argument,
                   "{}: the outer optimizer's lr must be a finite number > 0, got {}", who, outer.lr);
    SHARDOPT_CHECK(std::isfinite(outer.momentum) && outer.momentum >= 0.0 && outer.momentum < 1.0, invalid_argument,
                   "{}: the outer optimizer's momentum must lie in [0, 1), got {}", who, outer.momentum);
    SHARDOPT_CHECK(!outer.nesterov || outer.momentum > 0.0, invalid_argument,
                   "{}: the outer optimizer's Nesterov momentum requires a momentum > 0 (torch's SGD rule)", who);
  }
  return config;
}

int level_at(const AveragerConfig& config, int64_t step) {
  if (step < config.warmup_steps) return -1;
  if (!config.hierarchical) {
    return (step - config.warmup_steps) % config.levels[0].period == 0 ? 0 : -1;
  }
  for (std::size_t i = config.levels.size(); i-- > 0;) {
    if (step % config.levels[i].period == 0) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace averaging
}  // namespace shardopt
