// src/averaging/replica_groups.cpp — checks that the replicas partition the world alike, then splits the level communicators.
#include "averaging/replica_groups.hpp"

#include "core/check.hpp"

namespace shardopt {
namespace averaging {

namespace {

void check_partition(const std::vector<RankPlace>& places) {
  const int world = static_cast<int>(places.size());
  const int size = places[0].replica_size;
  for (int r = 0; r < world; ++r) {
    const RankPlace& p = places[static_cast<std::size_t>(r)];
    SHARDOPT_CHECK(p.replica_size == size, invalid_argument,
                   "model averaging: every replica (the optimizer's communicator) must have the same number of ranks: "
                   "world rank 0's has {}, world rank {}'s has {}",
                   size, r, p.replica_size);
    SHARDOPT_CHECK(p.replica_leader >= 0 && p.replica_leader < world, invalid_argument,
                   "model averaging: world rank {}'s replica starts at rank {}, outside the world of {}", r,
                   p.replica_leader, world);
    const RankPlace& leader = places[static_cast<std::size_t>(p.replica_leader)];
    SHARDOPT_CHECK(leader.replica_rank == 0 && leader.replica_leader == p.replica_leader, invalid_argument,
                   "model averaging: the optimizer's communicators are not a split of the world communicator (world "
                   "rank {} counts world rank {} as its replica's first rank, which is not)",
                   r, p.replica_leader);
  }
  SHARDOPT_CHECK(world % size == 0, invalid_argument,
                 "model averaging: replicas of {} ranks cannot partition a world of {}", size, world);
  // Each replica: exactly ranks 0..size-1 once.
  std::vector<int> seen(static_cast<std::size_t>(world) * static_cast<std::size_t>(size), -1);
  for (int r = 0; r < world; ++r) {
    const RankPlace& p = places[static_cast<std::size_t>(r)];
    SHARDOPT_CHECK(p.replica_rank >= 0 && p.replica_rank < size, invalid_argument,
                   "model averaging: world rank {} has replica rank {} in a replica of {}", r, p.replica_rank, size);
    int& slot = seen[static_cast<std::size_t>(p.replica_leader) * static_cast<std::size_t>(size) +
                     static_cast<std::size_t>(p.replica_rank)];
    SHARDOPT_CHECK(slot < 0, invalid_argument,
                   "model averaging: world ranks {} and {} both claim rank {} of the replica starting at world rank {}: "
                   "the optimizers' communicators are not a split of the world communicator",
                   slot, r, p.replica_rank, p.replica_leader);
    slot = r;
  }
}

}  // namespace

ReplicaGroups make_replica_groups(Communicator& world, const std::vector<RankPlace>& places,
                                  const AveragerConfig& config) {
  check_partition(places);
  const int me = world.rank();
  const RankPlace& mine = places[static_cast<std::size_t>(me)];
  ReplicaGroups groups;
  groups.replica_size = mine.replica_size;
  groups.num_replicas = world.size() / mine.replica_size;
  groups.local_rank = mine.replica_rank;
  for (const RankPlace& p : places) {
    if (p.replica_rank == 0 && p.replica_leader < mine.replica_leader) ++groups.replica_index;
  }
  // torch's dist.new_subgroups(g): consecutive world ranks. A replica must lie inside one group
  // of every level, or its ranks would average with different partners and drift apart.
  for (const AveragingLevel& level : config.levels) {
    for (int r = 0; r < world.size(); ++r) {
      const int leader = places[static_cast<std::size_t>(r)].replica_leader;
      SHARDOPT_CHECK(r / level.group_size == leader / level.group_size, invalid_argument,
                     "model averaging: world ranks {} and {} form one replica but fall into different averaging "
                     "groups of {} consecutive ranks (period {}): each group must hold whole replicas",
                     leader, r, level.group_size, level.period);
    }
  }
  for (const AveragingLevel& level : config.levels) {
    const int color = (me / level.group_size) * groups.replica_size + groups.local_rank;
    groups.level_peers.push_back(world.split(color, me));
  }
  groups.world_peers = groups.level_peers.back();
  return groups;
}

}  // namespace averaging
}  // namespace shardopt
