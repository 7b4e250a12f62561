// src/optim/param_sync.hpp — after the update, every rank's shard of the parameters reaches every rank: bucketed broadcasts from each owner, optionally pipelined with the update.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "optim/shard_state.hpp"

namespace shardopt {
namespace optim {

class ParamSync {
 public:
  ParamSync(const DeviceContext& dev, const OptimizerConfig& config, const ParamTable& table, ShardState& shard)
      : dev_(dev), config_(config), table_(table), shard_(shard) {}

  // Collective when sharded: every rank's shard reaches every rank (external storage copies
  // through the staging buffer into the caller's buffers; node-shared parameters need only
  // the other nodes' shards).
  void sync();
  // update(lo, hi) updates this rank's shard elements [lo, hi). Unpipelined: the whole update,
  // then sync(). Pipelined (bucket view, sharded, config.pipeline_chunk_bytes > 0): chunk k's
  // broadcasts (one group over the owners) run while chunk k+1 is updated; every rank walks the
  // same (chunk, owner) order. On a device neither form blocks the host: the compute stream
  // waits for the last broadcasts (DeviceContext::finish_collectives).
  void update_and_sync(const std::function<void(int64_t, int64_t)>& update);

 private:
  // Bucket by bucket, each rank's shard of `buffer` (laid out as the layout's shards) is
  // broadcast from its owner, each bucket's pieces as one group, all in flight together; every bucket is config.bucket_bytes at
  // most, so no single collective exceeds it (or MPI's count limit).
  void exchange_shards(void* buffer);
  // The bucketed broadcasts behind both exchanges: rank r's shard of `buffer` from `comm`'s
  // rank root_of(r), skipped where that is negative; all in flight together.
  void broadcast_shards(Communicator& comm, void* buffer, const std::function<int(int)>& root_of);
  // Node-shared `buffer` (laid out as the layout's shards): each rank has written its shard
  // into its node's copy, so a node needs only a barrier; between nodes, each shard is
  // broadcast once to every other node by its carrier group, then a second barrier publishes
  // what arrived.
  void sync_nodes(const comm::NodeTopology& nodes, const core::FlatBuffer& buffer);
  void copy_segments(const partition::RankShard& shard, bool to_staging);

  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  const ParamTable& table_;
  ShardState& shard_;
  // Reused by every exchange, so that a step allocates no host memory for them either.
  std::vector<BroadcastPart> parts_;
  std::vector<std::unique_ptr<PendingCollective>> pending_;
};

}  // namespace optim
}  // namespace shardopt
