// src/comm/mpi/mpi_cuda_support.cpp — asks Open MPI (MPIX_Query_cuda_support, <mpi-ext.h>) whether it is CUDA-aware.
#include "comm/mpi/mpi_cuda_support.hpp"

#include <mpi.h>
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

namespace shardopt {
namespace mpi_support {

bool mpi_cuda_aware(std::string* reason) {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  // The compile-time MPIX_CUDA_AWARE_SUPPORT describes the headers shardopt was built against;
  // the library loaded now may differ, so only its run-time answer counts.
  if (MPIX_Query_cuda_support() == 1) return true;
  if (reason != nullptr) {
    *reason = "Open MPI reports that it is not CUDA-aware (MPIX_Query_cuda_support() returned 0: "
              "it was built without CUDA support, or CUDA support is disabled at run time)";
  }
  return false;
#else
  if (reason != nullptr) {
    *reason = "this MPI library cannot say whether it is CUDA-aware (<mpi-ext.h> has no "
              "MPIX_Query_cuda_support, which Open MPI provides)";
  }
  return false;
#endif
}

}  // namespace mpi_support
}  // namespace shardopt
