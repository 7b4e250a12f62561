// src/comm/node_shared_memory.hpp — one host buffer that every rank of a node maps: POSIX shared memory, named over the node's communicator.
//
// Why not MPI_Win_allocate_shared: freeing an MPI window is collective (a barrier over its
// group), so destroying an optimizer after a peer died, or on one rank after an error, would
// hang; and it would tie node sharing to MPI. Here creation is collective, unmapping is local.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

struct NodeSharedBuffer {
  std::shared_ptr<void> mapping;  // unmaps when the last holder lets go; never waits for a peer
  void* data = nullptr;           // page-aligned, zero-filled at creation
  std::size_t bytes = 0;
};

// Collective over `node` (a group from split_node()). The node's first rank creates the buffer
// and reserves all its pages up front, so a full /dev/shm is an error here rather than a
// SIGBUS at first write; every rank then maps it, and the name is removed as soon as all have,
// so nothing outlives the processes. If any rank fails, every rank gets an empty buffer and
// `why_not` names the rank and the reason. If the exchange itself throws (a timeout, a poisoned
// communicator), the name is removed and the mapping dropped before the error leaves: a failed
// construction leaves no segment in /dev/shm. (Only a process killed within the exchange can.)
NodeSharedBuffer map_node_shared(Communicator& node, std::size_t bytes, std::string& why_not);

}  // namespace comm
}  // namespace shardopt
