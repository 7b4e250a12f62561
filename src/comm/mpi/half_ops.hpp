// src/comm/mpi/half_ops.hpp — the user-defined MPI_Ops that sum and max bf16/f16 words (comm/mpi/half_reduce.hpp's arithmetic).
#pragma once

#include <mpi.h>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// The MPI_Op for `op` (sum or max; avg uses sum) on `dtype` (bf16 or f16), made once per
// process on first use and freed at the start of MPI_Finalize. Error(comm) if MPI refuses.
MPI_Op half_op(DType dtype, ReduceOp op);

}  // namespace comm
}  // namespace shardopt
