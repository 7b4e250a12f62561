// src/comm/node_topology.cpp — discovering nodes through split_node() and building the cross-node groups (see node_topology.hpp).
#include "comm/node_topology.hpp"

#include <algorithm>
#include <cstdint>
#include <map>

#include "comm/raw_collectives.hpp"

namespace shardopt {
namespace comm {
namespace {

struct Placement {
  int32_t node_leader = 0;  // world rank of the node's first rank
  int32_t local_rank = 0;
  int32_t node_size = 0;
};

}  // namespace

std::shared_ptr<const NodeTopology> discover_nodes(Communicator& world) {
  std::shared_ptr<Communicator> node = world.split_node();
  // split_node() answers alike on every rank: the backend decides, not the rank.
  if (!node) return nullptr;
  Placement mine;
  mine.node_leader = world.rank();
  broadcast_record(*node, mine.node_leader, 0);
  mine.local_rank = node->rank();
  mine.node_size = node->size();
  const std::vector<Placement> all = all_gather_records(world, mine);

  auto topology = std::make_shared<NodeTopology>();
  topology->node = std::move(node);
  std::map<int32_t, int> index_of_leader;
  for (const Placement& p : all) index_of_leader.emplace(p.node_leader, 0);
  int next = 0;
  for (auto& entry : index_of_leader) entry.second = next++;
  topology->nodes = next;
  bool uniform = true;
  for (const Placement& p : all) {
    uniform = uniform && p.node_size == all[0].node_size;
    topology->largest_node = std::max(topology->largest_node, static_cast<int>(p.node_size));
  }
  for (const Placement& p : all) {
    topology->node_of.push_back(index_of_leader[p.node_leader]);
    topology->carrier.push_back(uniform ? p.local_rank : 0);
  }
  const std::size_t me = static_cast<std::size_t>(world.rank());
  topology->own_carrier = uniform || mine.local_rank == 0 ? topology->carrier[me] : -1;
  if (topology->nodes > 1) {
    // Keyed by node index, so a group's rank n is its member on node n.
    topology->cross = world.split(topology->own_carrier, topology->node_of[me]);
  }
  return topology;
}

}  // namespace comm
}  // namespace shardopt
