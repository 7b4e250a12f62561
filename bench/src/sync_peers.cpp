// bench/src/sync_peers.cpp — times a blocking MPI_Allgather and a memcpy of the sync's bytes, the two things a copying parameter sync should run at.
#include "sync_peers.hpp"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "support.hpp"

namespace shardopt_bench {
SyncPeers time_sync_peers(shardopt::Communicator& comm, int64_t block_bytes, int64_t received_bytes,
                          int warmup, int iters) {
  SyncPeers peers;
  const int world = comm.size();
  // The bench's world is MPI_COMM_WORLD (mpirun's ranks). MPI_Allgather counts are ints: a
  // block past INT_MAX bytes is not measured (-1).
  if (block_bytes <= INT_MAX) {
    const int count = static_cast<int>(block_bytes);
    std::vector<char> send(static_cast<std::size_t>(std::max(count, 1)), 1);
    std::vector<char> gathered(send.size() * static_cast<std::size_t>(world), 0);
    peers.mpi_allgather_s = time_collectively(comm, std::max(warmup, 1), iters, [&] {
      if (MPI_Allgather(send.data(), count, MPI_BYTE, gathered.data(), count, MPI_BYTE, MPI_COMM_WORLD) != MPI_SUCCESS) {
        throw std::runtime_error("MPI_Allgather failed");
      }
    });
  } else {
    peers.mpi_allgather_s = -1;
  }
  std::vector<char> source(static_cast<std::size_t>(std::max<int64_t>(received_bytes, 1)), 2);
  std::vector<char> target(source.size(), 0);
  peers.memcpy_s = time_collectively(comm, std::max(warmup, 1), iters, [&] {
    std::memcpy(target.data(), source.data(), static_cast<std::size_t>(received_bytes));
  });
  return peers;
}

}  // namespace shardopt_bench
