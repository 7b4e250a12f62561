// src/comm/mpi/mpi_cuda_support.hpp — whether the MPI library in this process takes CUDA device pointers (CUDA-aware MPI).
#pragma once

#include <string>

namespace shardopt {
namespace mpi_support {

// Asks the MPI library loaded at run time (MPI must be initialised). When the answer is no,
// or the library cannot tell, returns false and `reason` says which.
bool mpi_cuda_aware(std::string* reason);

}  // namespace mpi_support
}  // namespace shardopt
