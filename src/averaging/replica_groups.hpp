// src/averaging/replica_groups.hpp — the replicas (local groups) of a world communicator, checked, and the communicators the averaging levels run over.
#pragma once

#include <memory>
#include <vector>

#include "shardopt/averaging.hpp"

namespace shardopt {
namespace averaging {

// This rank's place among the replicas, and the communicators of each averaging level.
struct ReplicaGroups {
  int replica_size = 1;    // L
  int num_replicas = 1;    // world size / L
  int local_rank = 0;      // rank within the replica
  int replica_index = 0;   // replicas numbered by their first world rank
  // Per level: the ranks of this rank's level group with its local rank (one per replica of the
  // group). They hold the same shard of the model, so averaging their shards averages the model.
  std::vector<std::shared_ptr<Communicator>> level_peers;
  // The same over the whole world (the last level's): the warmup's gradient averaging.
  std::shared_ptr<Communicator> world_peers;
};

// Collective over `world`, after the agreement of the averager's construction proved every
// rank is in it. `places` lists, for every world rank, its replica size, its rank in the
// replica and the world rank of the replica's first rank. Error(invalid_argument) when these are not equal-sized replicas partitioning the world
// or a replica straddles a level's groups: the same on every rank, since all see the same list.
struct RankPlace {
  int replica_size = 0;
  int replica_rank = 0;
  int replica_leader = 0;
};
ReplicaGroups make_replica_groups(Communicator& world, const std::vector<RankPlace>& places,
                                  const AveragerConfig& config);

}  // namespace averaging
}  // namespace shardopt
