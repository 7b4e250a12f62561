// src/optim/memory_budget.cpp — counting a registration's host buffers and buckets, and the checks against the machine's memory and kMaxBuckets.
#include "optim/memory_budget.hpp"

#include <sys/sysinfo.h>

#include <deque>
#include <string>

#include "core/check.hpp"
#include "core/flat_buffer.hpp"
#include "optim/shard_state.hpp"
#include "optim/state_kinds.hpp"

namespace shardopt {
namespace optim {

MemoryBudget registration_budget(const OptimizerConfig& config, const ParamTable& table, const Registration& added,
                                 int rank, int world) {
  std::vector<partition::ParamInfo> infos = table.infos_with(added);
  // Checks every count (each within 2^56, as their sum and the padded buffer), so the byte
  // counts below stay far inside int64.
  const partition::Layout layout = partition::make_layout(strategy_of(config), infos, world, kShardAlignment);
  const int64_t all = partition::checked_total_numel(infos, /*frozen_too=*/true);
  const int64_t shard = layout.shards[static_cast<std::size_t>(rank)].numel;
  const DType dtype = added.choice.dtype;
  auto bytes = [](int64_t numel, DType d) { return static_cast<int64_t>(core::FlatBuffer::allocation_bytes(numel, d)); };

  std::deque<Hyperparams> groups = table.groups();
  groups.insert(groups.end(), added.groups.begin(), added.groups.end());
  std::deque<Algorithm> algorithms = table.algorithms();
  algorithms.insert(algorithms.end(), added.algorithms.begin(), added.algorithms.end());
  const auto kinds = state_kinds_needed(algorithms, dtype, groups);
  // Each kind over the params whose algorithm keeps it (place_moments; fp32 moments throughout,
  // the most 8-bit groups could need).
  std::vector<StateMask> holds;
  for (const partition::ParamInfo& info : infos) holds.push_back(algorithm_kinds(algorithms[static_cast<std::size_t>(info.group)]));
  const MomentLayout places =
      place_moments(layout.shards[static_cast<std::size_t>(rank)], std::vector<bool>(infos.size(), false), holds);
  MemoryBudget budget;
  for (std::size_t k = 0; k < kStateKinds; ++k) budget.state += kinds[k] ? bytes(places.numel[k], DType::f32) : 0;
  const bool stage2 = config.stage == 2;
  const bool sharded = config.shard_state && world > 1;
  if (config.storage == Storage::bucket_view) {
    // The flat parameter buffer with the frozen parameters behind it, and its gradients.
    budget.params = bytes(layout.buffer_numel + (all - layout.trainable_numel), dtype);
    budget.grads = stage2 ? 0 : budget.params;
  } else {
    budget.params = sharded ? bytes(layout.buffer_numel, dtype) : 0;  // the sync's staging copy
  }
  if (stage2) budget.grads += bytes(shard, dtype);  // this rank's reduced shard
  return budget;
}

void check_bucket_count(const OptimizerConfig& config, const ParamTable& table, const Registration& added, int world) {
  std::vector<partition::ParamInfo> infos = table.infos_with(added);
  // At most 2^56 (registration_budget checked it), the quantum at most 2^35: no overflow below.
  const int64_t all = partition::checked_total_numel(infos, /*frozen_too=*/true);
  // Every layout's buffer is at most every parameter, padded to whole aligned shards.
  const int64_t quantum = kShardAlignment * world;
  const int64_t buffer = (all + quantum - 1) / quantum * quantum;
  const DType dtype = added.choice.dtype;
  const int64_t bucket = bucket_elements(config, dtype);
  const int64_t buckets = (buffer + bucket - 1) / bucket;
  if (buckets <= kMaxBuckets) return;
  const int64_t least_elements = (buffer + kMaxBuckets - 1) / kMaxBuckets;
  // A bucket is one collective: never more than bucket_elements' cap, whatever bucket_bytes says.
  OptimizerConfig widest = config;
  widest.bucket_bytes = INT64_MAX;
  const bool fits = least_elements <= bucket_elements(widest, dtype);
  raise(ErrorCode::invalid_argument,
        "config.bucket_bytes = {} cuts the parameters ({} elements of {} with every parameter trainable) into {} "
        "buckets of {} elements, more than the {} a step issues; {}",
        config.bucket_bytes, all, dtype_name(dtype), buckets, bucket, kMaxBuckets,
        fits ? fmt::format("use a bucket_bytes of at least {}", least_elements * static_cast<int64_t>(dtype_size(dtype)))
             : std::string("no bucket_bytes makes so many elements fit"));
}

int64_t host_memory_bytes() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return 0;
  const auto unit = static_cast<int64_t>(info.mem_unit);
  return (static_cast<int64_t>(info.totalram) + static_cast<int64_t>(info.totalswap)) * unit;
}

void check_budget(const MemoryBudget& budget, int64_t available, int rank) {
  if (available <= 0) return;
  SHARDOPT_CHECK(budget.total() <= available, out_of_memory,
                 "out of memory: allocating the optimizer's buffers on rank {} takes {} bytes (parameters {}, "
                 "gradients {}, optimizer state {}), more than this machine's {} bytes of memory and swap",
                 rank, budget.total(), budget.params, budget.grads, budget.state, available);
}

}  // namespace optim
}  // namespace shardopt
