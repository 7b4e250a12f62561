// bench/src/sync_peers.hpp — what the optimizer's copying parameter sync is measured against in the same run: a plain blocking MPI_Allgather and a memcpy of the same bytes.
#pragma once

#include <cstdint>

#include "shardopt/communicator.hpp"

namespace shardopt_bench {

struct SyncPeers {
  double mpi_allgather_s = 0;  // MPI_Allgather of `block_bytes` per rank, warm buffers; -1: not measured
  double memcpy_s = 0;         // memcpy of the bytes this rank receives, warm buffers
};

// Both timed like the step (between barriers, median over `iters` of the slowest rank, after
// `warmup` untimed calls); every buffer is written before the first call, so no page is
// touched for the first time while timed. `block_bytes` is the largest rank's shard, as the
// flat partition's all-gather moves; `received_bytes` what this rank receives in the sync.
SyncPeers time_sync_peers(shardopt::Communicator& comm, int64_t block_bytes, int64_t received_bytes,
                          int warmup, int iters);

}  // namespace shardopt_bench
