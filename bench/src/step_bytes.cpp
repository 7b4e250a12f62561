// bench/src/step_bytes.cpp — counts what a step and a gradient reduction must move (see step_bytes.hpp and roofline.hpp).
#include "step_bytes.hpp"

#include <algorithm>

#include "roofline.hpp"
#include "support.hpp"

namespace shardopt_bench {

StepBytes count_step_bytes(Communicator& comm, const Options& o, const Model& model, const shardopt::MemoryReport& memory,
                           const CacheInfo& llc) {
  StepBytes bytes;
  const int rank = comm.rank();
  const bool sharded = o.sharded && comm.size() > 1;
  bytes.shards = gather_int64(comm, memory.shard_numel);
  int64_t all_shards = 0;
  for (int64_t s : bytes.shards) all_shards += s;
  const auto element_bytes = static_cast<int64_t>(shardopt::dtype_size(o.dtype));
  // Elements this rank updates: its shard less the flat partition's tail padding, which no
  // kernel touches (sorted_greedy and replicated shards have none).
  int64_t my_offset = 0;
  for (int r = 0; r < rank; ++r) my_offset += bytes.shards[static_cast<std::size_t>(r)];
  bytes.my_updated = o.sharded && o.partition == PartitionStrategy::flat
                         ? std::clamp<int64_t>(memory.trainable_numel - my_offset, 0, memory.shard_numel)
                         : memory.shard_numel;
  // The sync moves the padding too, so received elements include it. Each element moved is
  // read once and written once, in the dtype.
  const std::vector<int64_t> nodes = gather_int64(comm, node_id());
  int64_t node_shards = 0, node_ranks = 0;
  for (std::size_t r = 0; r < nodes.size(); ++r) {
    if (nodes[r] != nodes[static_cast<std::size_t>(rank)]) continue;
    node_shards += bytes.shards[r];
    ++node_ranks;
  }
  bytes.my_moved = sharded ? all_shards - memory.shard_numel : 0;
  if (sharded && memory.node_shared_param_bytes > 0) {
    // Bucket view: one buffer per node, so only other nodes' shards arrive, each once per node
    // (its carrier rank receives it), counted as this rank's share of its node's arrivals.
    // External storage through a node-shared staging: its own shard copied in, the others out.
    bytes.my_moved = o.storage == Storage::bucket_view ? (all_shards - node_shards) / std::max<int64_t>(1, node_ranks)
                                                       : all_shards;
  }
  int64_t my_update = bytes.my_updated * update_bytes_per_param(update_shape(o), o.dtype);
  if (o.state_precision != shardopt::StatePrecision::fp32 || o.master != shardopt::MasterStorage::fp32) {
    // Compact state: the bytes the kept arrays hold, read and written once (state_bytes counts
    // the codes, the absmax and any fp32 moments of small params; master_bytes the remainders
    // or fp32 masters), the gradient read and the parameter written in the dtype, and the
    // parameter read where it holds (part of) the master: f32, or bf16 with remainders.
    const bool param_read = o.dtype == DType::f32 || o.master == shardopt::MasterStorage::remainder16;
    my_update = bytes.my_updated * element_bytes * (param_read ? 3 : 2) + 2 * (memory.state_bytes + memory.master_bytes);
  }
  bytes.update = sum_int64(comm, my_update);
  bytes.sync = sum_int64(comm, 2 * element_bytes * bytes.my_moved);
  const int64_t my_reduced = comm.size() == 1 ? 0 : sharded ? bytes.my_updated : model.numel / comm.size();
  bytes.reduce = sum_int64(comm, (node_ranks + 1) * my_reduced * element_bytes);

  // Is the step DRAM-bound? The bytes a step touches on each machine (every rank's parameters,
  // its shard's gradients, state and masters) against the most last-level cache any source
  // claims for that machine (sysfs or sysconf: in a virtual machine the host's cache may hold
  // more than the guest is told). Only when every machine's data overflow it is the roofline a
  // bound that a measurement may not exceed.
  const int64_t touched = model.numel * element_bytes + bytes.my_updated * element_bytes + memory.state_bytes + memory.master_bytes;
  const std::vector<int64_t> touched_by = gather_int64(comm, touched);
  int64_t touched_here = 0;
  for (std::size_t r = 0; r < nodes.size(); ++r) touched_here += nodes[r] == nodes[static_cast<std::size_t>(rank)] ? touched_by[r] : 0;
  const bool resident_here = static_cast<double>(touched_here) <= kCacheResidentFactor * static_cast<double>(llc.largest_claim_bytes());
  bytes.cache_resident = max_int64(comm, resident_here ? 0 : 1) == 0;
  return bytes;
}

}  // namespace shardopt_bench
