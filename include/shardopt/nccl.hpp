// shardopt/nccl.hpp — the NCCL communicator (device buffers, bootstrapped over MPI), when the library has it.
//
// Includes no CUDA, NCCL or MPI header: streams are `void*` holding a cudaStream_t and the
// MPI communicator is passed as a pointer to an MPI_Comm, as in mpi_borrow().
#pragma once

#include <memory>

#include "shardopt/export.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {

// Whether this build of shardopt contains the NCCL backend. Without it the factories below
// raise Error(unsupported).
SHARDOPT_API bool nccl_compiled_in();

// One NCCL rank per MPI rank of MPI_COMM_WORLD (MPI is initialised first if nobody has, as by
// mpi_world()). Each rank uses CUDA device (node-local rank % devices on the node), or the
// device of `stream` when one is given; that device is made current on the calling thread.
// Collectives are issued on `stream` (a cudaStream_t), or on a stream the communicator creates
// when it is null: a blocking stream, so work enqueued on the legacy default stream (stream 0,
// a plain cudaMemcpy) before a call is ordered before the collective, and such work after a
// completed call after it; with a stream of the caller's, ordering against the caller's other
// streams is the caller's (events). Buffers must be device (or managed) memory on device(). Blocking calls return once the collective has completed on the GPU;
// the *_async forms return as soon as it is enqueued, and their wait() blocks until it has
// completed. Every wait is bounded by options.timeout_seconds: a collective that does not
// finish in time, or that NCCL reports as failed, aborts the NCCL communicator and raises
// Error(timeout) or Error(comm) naming the operation and rank; every later call on it (or on
// its pending collectives) then raises the same code at once, naming that operation.
// cuda_aware() is true and cuda_stream() is the stream below.
// Collective over MPI_COMM_WORLD; a rank that cannot set up its device makes every rank raise.
SHARDOPT_API std::shared_ptr<Communicator> nccl_world(const CommOptions& options = {}, void* stream = nullptr);

// The same over the caller's MPI communicator: `mpi_comm` points at an MPI_Comm; MPI must be
// initialised and stays the caller's to finalise. Collective over that communicator.
SHARDOPT_API std::shared_ptr<Communicator> nccl_borrow(const void* mpi_comm, const CommOptions& options = {},
                                          void* stream = nullptr);

// The cudaStream_t a NCCL communicator issues its collectives on, so that callers can order
// their kernels against it (events, or by using the same stream). Error(invalid_argument) if
// `comm` is not a NCCL communicator.
SHARDOPT_API void* nccl_stream(const Communicator& comm);

}  // namespace shardopt
