// src/comm/nccl/nccl_communicator.hpp — making a NCCL Communicator from an initialised NcclState (the bootstrap's last step).
#pragma once

#include <nccl.h>

#include <memory>

#include "comm/nccl/nccl_state.hpp"
#include "shardopt/comm_backend.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// The configuration every NCCL communicator of shardopt is made with: non-blocking, so that
// every wait is bounded (see nccl_state.hpp).
ncclConfig_t nonblocking_config();

// Fills in rank/size and the barrier scratch of a freshly initialised communicator.
void finish_nccl_state(NcclState& s);

// The Communicator over `state` (initialised and finished).
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<NcclState> state);

}  // namespace comm
}  // namespace shardopt
