// src/comm/mpi/mpi_comm_of.hpp — the MPI_Comm under an MPI communicator, for modules that add their own point-to-point traffic (the remote optimizer duplicates it).
#pragma once

#include <mpi.h>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// The communicator's own duplicate of the caller's MPI_Comm (its collectives run on it: duplicate
// it before sending anything of your own); MPI_COMM_NULL when `communicator` is not the MPI
// backend's (NCCL, one implemented in Python, a wrapper).
MPI_Comm mpi_comm_of(Communicator& communicator);

}  // namespace comm
}  // namespace shardopt
