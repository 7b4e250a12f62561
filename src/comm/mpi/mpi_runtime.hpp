// src/comm/mpi/mpi_runtime.hpp — MPI's lifetime in a process where shardopt may be the one that initialises it, and MPI error texts.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/watchdog.hpp"

namespace shardopt {
namespace comm {

// Initialises MPI when nobody has (MPI_THREAD_SERIALIZED; under Open MPI with libnbc's binomial
// MPI_Ireduce unless the environment names another, see mpi_runtime.cpp) and, in that case
// only, finalises it when destroyed. One per process: see shared_mpi_runtime().
//
// Finalising is bounded: MPI_Finalize waits for every process of the job, forever when one has
// died or is cut off and the launcher lets the survivors run (mpirun --enable-recovery). So
// the ranks first meet in a watched barrier, and a process whose peers do not all reach exit
// within the longest collective timeout its communicators use ends without MPI_Finalize (its
// launcher then reports an improper exit, which the job is). After MPI_Finalize the memory
// that timed-out collectives held (core/abandoned_memory.hpp) is freed: MPI can no longer touch it.
class MpiRuntime {
 public:
  MpiRuntime();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // A communicator of this process uses `seconds` as its collective timeout (<= 0: none).
  void note_timeout(double seconds);

 private:
  // True when every process of the job reaches this point within exit_timeout_ (a watched
  // barrier on MPI_COMM_WORLD), or when no timeout is in use.
  bool peers_reach_exit() const;

  bool owns_ = false;
  double exit_timeout_ = 0.0;
};

// The process's runtime. MPI can be initialised only once per process, so a static holds it
// until exit: MPI stays initialised after the last communicator is destroyed, and is finalised
// at process exit if shardopt initialised it. Error(comm) if MPI was already finalised.
std::shared_ptr<MpiRuntime> shared_mpi_runtime();

// While alive, `comm`'s error handler is MPI_ERRORS_RETURN; the caller's handler is restored
// after. Open MPI invokes MPI_COMM_WORLD's handler (fatal by default: the whole job aborts)
// for errors of nonblocking collectives found by MPI_Test, whatever communicator they ran on,
// so shardopt's polling runs under a guard on MPI_COMM_WORLD and turns such errors into
// Errors; a guard on a caller's communicator covers a collective shardopt issues on it. Local
// (no communication) and cheap: two handler swaps.
class ErrorsReturn {
 public:
  explicit ErrorsReturn(MPI_Comm comm = MPI_COMM_WORLD);
  ~ErrorsReturn();
  ErrorsReturn(const ErrorsReturn&) = delete;
  ErrorsReturn& operator=(const ErrorsReturn&) = delete;

 private:
  MPI_Comm comm_;
  MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
};

// Tests `request` until it completes, MPI fails it, or `deadline` passes, under ErrorsReturn
// on MPI_COMM_WORLD; returns MPI's code (MPI_SUCCESS unless it failed) and sets `completed`.
// The one polling loop of shardopt's MPI code.
int test_until(MPI_Request& request, const Deadline& deadline, bool& completed);

// MPI_Query_thread's level in words, and Error(unsupported) naming it when it is below
// MPI_THREAD_SERIALIZED (whoever initialised MPI).
const char* thread_level_name(int level);
void require_serialized_thread_level();

// MPI initialised by shardopt from now on asks for MPI_THREAD_MULTIPLE (as it does when the
// environment sets SHARDOPT_MPI_THREAD_MULTIPLE=1); no effect once MPI is initialised.
void request_thread_multiple();
bool thread_multiple_requested();

// MPI's text for an error code.
std::string mpi_error_string(int code);

}  // namespace comm
}  // namespace shardopt
