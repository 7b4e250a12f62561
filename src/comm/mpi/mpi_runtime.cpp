// src/comm/mpi/mpi_runtime.cpp — initialising MPI on first use, finalising it at exit when shardopt initialised it.
#include "comm/mpi/mpi_runtime.hpp"

#include <mpi.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "comm/watchdog.hpp"
#include "core/abandoned_memory.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace comm {

namespace {

// Open MPI's nonblocking collectives (libnbc) reduce a large message on 2-4 ranks with a chain
// of 8 KiB segments that advances only inside MPI calls, one segment per call: waited on by
// the watchdog's polling (comm/watchdog.hpp), stage 2's per-owner reduce of an 80M-element f32
// model took 23.9 s at world 2, against 3.1 s for stage 1's all-reduce of the same gradients in
// the same minutes. Its binomial tree (algorithm 2) sends each bucket in one message per round:
// 1.6 s against 1.5 s (bench/MEASURED.md, "stage 2's MPI_Ireduce"). Set before MPI_Init, where the
// MCA parameters are read; a value already in the environment (the user's, or mpirun --mca's)
// wins, and MPIs other than Open MPI ignore the name. Where the caller initialises MPI, the
// caller's environment decides.
// Only at world sizes of 1 and 2 (Open MPI's launcher says the size before MPI_Init): there the
// sum of two ranks' values is the same whichever rank adds, while at 3 or more ranks the tree
// associates the sums differently from the all-reduce of stage 1 and of the replicated
// reference (communicator.hpp), and stage 2 would no longer end on the bits stage 1 does.
void prefer_binomial_ireduce() {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (world != nullptr && std::atoi(world) > 2) return;
  setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", /*overwrite=*/0);
}

std::atomic<bool>& multiple_requested() {
  static std::atomic<bool> requested{false};
  return requested;
}

}  // namespace

void request_thread_multiple() { multiple_requested().store(true); }

bool thread_multiple_requested() {
  const char* env = std::getenv("SHARDOPT_MPI_THREAD_MULTIPLE");
  return multiple_requested().load() || (env != nullptr && std::string(env) == "1");
}

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    prefer_binomial_ireduce();
    int provided = 0;
    // SERIALIZED: with config.overlap the optimizer's calls run on its communication thread
    // (comm/comm_thread.hpp), one call at a time; require_serialized_thread_level() checks.
    // MULTIPLE where asked for (the remote optimizer's service thread calls MPI beside the
    // caller's thread): request_thread_multiple().
    const int level = thread_multiple_requested() ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    if (MPI_Init_thread(nullptr, nullptr, level, &provided) != MPI_SUCCESS) {
      raise(ErrorCode::comm, "MPI_Init_thread failed");
    }
    owns_ = true;
  }
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!owns_ || finalized) return;
  if (!peers_reach_exit()) return;  // see the class comment
  MPI_Finalize();
  // The requests of collectives that timed out are gone with MPI: what they held may be freed.
  core::AbandonedMemory::process().release_all();
}

void MpiRuntime::note_timeout(double seconds) {
  if (std::isinf(seconds)) seconds = 0.0;  // waits forever: as no watchdog
  if (seconds > exit_timeout_) exit_timeout_ = seconds;
}

bool MpiRuntime::peers_reach_exit() const {
  if (exit_timeout_ <= 0) return true;
  MPI_Request request = MPI_REQUEST_NULL;
  {
    const ErrorsReturn world_errors;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &request) != MPI_SUCCESS) return false;
  }
  bool done = false;
  return test_until(request, Deadline(exit_timeout_), done) == MPI_SUCCESS && done;
}

int test_until(MPI_Request& request, const Deadline& deadline, bool& completed) {
  const ErrorsReturn world_errors;
  int code = MPI_SUCCESS;
  completed = poll_until(deadline, [&] {
    int flag = 0;
    code = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
    return flag != 0 || code != MPI_SUCCESS;
  });
  return code;
}

std::shared_ptr<MpiRuntime> shared_mpi_runtime() {
  static std::mutex mutex;
  static std::shared_ptr<MpiRuntime> runtime;
  std::lock_guard<std::mutex> lock(mutex);
  if (!runtime) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    SHARDOPT_CHECK(!finalized, comm, "MPI has already been finalized in this process");
    runtime = std::make_shared<MpiRuntime>();
  }
  return runtime;
}

ErrorsReturn::ErrorsReturn(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_get_errhandler(comm_, &saved_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

ErrorsReturn::~ErrorsReturn() {
  MPI_Comm_set_errhandler(comm_, saved_);
  MPI_Errhandler_free(&saved_);  // the reference MPI_Comm_get_errhandler returned
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
  }
}

void require_serialized_thread_level() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  SHARDOPT_CHECK(provided >= MPI_THREAD_SERIALIZED, unsupported,
                 "config.overlap runs the optimizer's MPI calls on a communication thread, which needs MPI "
                 "initialised with MPI_THREAD_SERIALIZED or higher, but this process's MPI provides {} (initialise "
                 "MPI with MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...), or let shardopt initialise it)",
                 thread_level_name(provided));
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace comm
}  // namespace shardopt
