// src/comm/mpi/peer_liveness.hpp — where each rank of a communicator runs (host and process id), so that a rank whose collective failed can name the peers that are no longer running.
//
// MPI's collectives do not say which peer is missing, and Open MPI 4.1 has no fault-tolerance
// interface to ask. What a rank can check by itself is whether the processes of its own host
// still run: the directory is gathered once when the communicator is made, and after a
// timeout or failure a rank looks up the peers on its host (kill(pid, 0), and /proc for a
// process that has died but is not yet reaped). Peers on other hosts cannot be checked from
// here; the message says so rather than guess.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace shardopt {
namespace comm {

class PeerDirectory {
 public:
  PeerDirectory() = default;
  // Collective over `comm` (a blocking all-gather of a few dozen bytes per rank). Returns the
  // MPI error code; on failure the directory stays empty and describe_missing() says nothing.
  int gather(MPI_Comm comm, int rank);
  // "; rank 1 (pid 4242 on host h1) is no longer running", one clause per such peer of this
  // host, or "" when every peer of this host still runs (or nothing could be gathered).
  std::string describe_missing() const;

 private:
  struct Peer {
    int pid = 0;
    std::string host;
  };
  std::vector<Peer> peers_;
  int rank_ = 0;
};

}  // namespace comm
}  // namespace shardopt
