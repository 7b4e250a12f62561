// src/optim/param_sync.cpp — the bucketed parameter sync (both partitions) and its pipelined form.
#include "optim/param_sync.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace shardopt {
namespace optim {

void ParamSync::broadcast_shards(Communicator& comm, void* buffer, const std::function<int(int)>& root_of) {
  const DType dt = shard_.dtype();
  const int64_t bucket = bucket_elements(config_, dt);
  const partition::Layout& layout = shard_.layout();
  int64_t largest = 0;
  for (int r = 0; r < dev_.world(); ++r) {
    if (root_of(r) >= 0) largest = std::max(largest, layout.shards[static_cast<std::size_t>(r)].numel);
  }
  // Bucket by bucket, every rank's piece of that bucket in one group.
  pending_.clear();  // what a failed exchange left (dropped, as its own handles would have been)
  for (int64_t begin = 0; begin < largest; begin += bucket) {
    parts_.clear();
    for (int r = 0; r < dev_.world(); ++r) {
      const int root = root_of(r);
      const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      if (root < 0 || begin >= shard.numel) continue;
      parts_.push_back(BroadcastPart{element(buffer, shard.offset + begin, dt), std::min(bucket, shard.numel - begin), root});
    }
    pending_.push_back(comm.broadcast_group_async(parts_.data(), parts_.size(), dt));
  }
  dev_.finish_collectives(pending_);
}

void ParamSync::exchange_shards(void* buffer) {
  dev_.settle_before_collective();
  broadcast_shards(dev_.comm(), buffer, [](int r) { return r; });
}

void ParamSync::copy_segments(const partition::RankShard& shard, bool to_staging) {
  const DType dt = shard_.dtype();
  for (const partition::Segment& s : shard.segments) {
    char* user = element(table_.params()[static_cast<std::size_t>(s.param)].user_param, s.param_offset, dt);
    char* staged = shard_.sync_staging().at(shard.offset + s.shard_offset);
    const std::size_t bytes = span_bytes(s.length, dt);
    if (bytes == 0) continue;
    if (to_staging) {
      dev_.copy_bytes(staged, user, bytes);
    } else {
      dev_.copy_bytes(user, staged, bytes);
    }
  }
}

void ParamSync::sync_nodes(const comm::NodeTopology& nodes, const core::FlatBuffer& buffer) {
  // The barriers order the ranks' plain stores into the shared buffer; the fences keep the
  // compiler from moving them across.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  nodes.node->barrier();
  if (nodes.nodes > 1) {
    if (nodes.cross) {
      // Rank r's shard travels in its carrier group, from that group's member on r's node.
      broadcast_shards(*nodes.cross, buffer.raw(), [&nodes](int r) {
        const std::size_t ru = static_cast<std::size_t>(r);
        return nodes.carrier[ru] == nodes.own_carrier ? nodes.node_of[ru] : -1;
      });
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
    nodes.node->barrier();
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ParamSync::sync() {
  if (!shard_.sharded()) return;
  const device::ScopedDevice scope(dev_.device());
  const comm::NodeTopology* nodes = shard_.node_sharing();
  if (shard_.bucket_view()) {
    if (nodes != nullptr) {
      sync_nodes(*nodes, shard_.flat_params());
    } else {
      exchange_shards(shard_.flat_params().raw());
    }
    return;
  }
  // External storage: through the staging buffer, which on a node may be shared (then the
  // sync is two memory copies per element and a barrier, instead of a collective's).
  copy_segments(shard_.own_shard(), /*to_staging=*/true);
  if (nodes != nullptr) {
    sync_nodes(*nodes, shard_.sync_staging());
  } else {
    exchange_shards(shard_.sync_staging().raw());
  }
  for (int r = 0; r < dev_.world(); ++r) {
    if (r != dev_.rank()) copy_segments(shard_.layout().shards[static_cast<std::size_t>(r)], /*to_staging=*/false);
  }
}

void ParamSync::update_and_sync(const std::function<void(int64_t, int64_t)>& update) {
  const DType dt = shard_.dtype();
  // Whole cache lines per chunk, and never more than one collective may carry.
  const int64_t chunk = std::min<int64_t>(
      int64_t{INT32_MAX} / kShardAlignment * kShardAlignment,
      config_.pipeline_chunk_bytes / static_cast<int64_t>(dtype_size(dt)) / kShardAlignment * kShardAlignment);
  if (chunk <= 0 || !shard_.sharded() || !shard_.bucket_view() || shard_.node_sharing() != nullptr) {
    update(0, shard_.own_shard().numel);
    sync();
    return;
  }
  const partition::Layout& layout = shard_.layout();
  int64_t largest = 0;
  for (const partition::RankShard& shard : layout.shards) largest = std::max(largest, shard.numel);
  // On a stream-ordered communicator chunk k's broadcasts run on the communication stream
  // while chunk k+1 is updated on the compute stream (they touch different elements); the host
  // only enqueues. Otherwise the host keeps two chunks in flight.
  constexpr std::size_t kChunksInFlight = 2;
  pending_.clear();
  for (int64_t begin = 0; begin < largest; begin += chunk) {
    update(begin, begin + chunk);  // nothing past this rank's shard
    dev_.settle_before_collective();
    parts_.clear();
    for (int r = 0; r < dev_.world(); ++r) {
      const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
      if (begin >= shard.numel) continue;
      parts_.push_back(BroadcastPart{shard_.flat_params().at(shard.offset + begin), std::min(chunk, shard.numel - begin), r});
    }
    pending_.push_back(dev_.comm().broadcast_group_async(parts_.data(), parts_.size(), dt));
    dev_.bound_in_flight(pending_, kChunksInFlight);
  }
  dev_.finish_collectives(pending_);
}

}  // namespace optim
}  // namespace shardopt
