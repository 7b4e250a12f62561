// bench/src/step_bytes.hpp — the bytes a step (update, sync) and a gradient reduction must move, summed over ranks, and whether they fit in the last-level cache: shared by the step and iteration modes.
#pragma once

#include <cstdint>
#include <vector>

#include "cache.hpp"
#include "model.hpp"
#include "options.hpp"
#include "shardopt/shardopt.hpp"

namespace shardopt_bench {

struct StepBytes {
  std::vector<int64_t> shards;  // every rank's shard_numel, in rank order
  int64_t my_updated = 0;       // elements this rank's update touches (flat: padding left out)
  int64_t my_moved = 0;         // elements this rank's sync must bring in (roofline.hpp)
  int64_t update = 0;           // summed over ranks (roofline.hpp)
  int64_t sync = 0;
  // The gradient average at its floor on one node: each rank reads its own elements in every
  // slot of its node (node_ranks reads) and writes the average once, (node_ranks + 1) x its
  // elements x sizeof(dtype), summed over ranks. Replicated state: 1/N of the model per rank
  // (what a node-shared reduce-scatter would hand each rank to sum); the full average is then
  // read by the update, which counts it. Traffic between nodes is not counted. 0 at world 1.
  int64_t reduce = 0;
  bool cache_resident = false;  // what one step touches fits in twice the largest claimed LLC
};

// Collective (gathers over `comm`).
StepBytes count_step_bytes(shardopt::Communicator& comm, const Options& o, const Model& model,
                           const shardopt::MemoryReport& memory, const CacheInfo& llc);

}  // namespace shardopt_bench
