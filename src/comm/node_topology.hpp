// src/comm/node_topology.hpp — which ranks share a node, and the groups that carry data between nodes, discovered once from a communicator.
#pragma once

#include <memory>
#include <vector>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// Nodes are numbered by their lowest rank. Between nodes, rank r's data travels in the cross
// group carrier[r] from its member on r's node, which is that group's rank node_of[r]: with
// equal-sized nodes the group of ranks with r's place on their node (the traffic spread over
// every rank), otherwise the group of each node's first rank.
struct NodeTopology {
  std::shared_ptr<Communicator> node;   // this rank's node, ordered as the world
  std::shared_ptr<Communicator> cross;  // this rank's cross group; null if it is in none, or one node
  int nodes = 1;
  int largest_node = 1;                 // ranks on the most populated node
  std::vector<int> node_of;             // by world rank
  std::vector<int> carrier;             // by world rank: the cross group that carries its data
  int own_carrier = -1;                 // the cross group this rank is in (-1: none)
};

// Collective over `world`. Null on every rank when the backend cannot share host memory.
std::shared_ptr<const NodeTopology> discover_nodes(Communicator& world);

}  // namespace comm
}  // namespace shardopt
