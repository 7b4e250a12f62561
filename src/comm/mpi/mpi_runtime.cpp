// src/comm/mpi/mpi_runtime.cpp — initialising MPI on first use, finalising it at exit when shardopt initialised it.
#include "comm/mpi/mpi_runtime.hpp"

#include <mpi.h>

#include <cstring>
#include <mutex>

#include "core/check.hpp"

namespace shardopt {
namespace comm {

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      raise(ErrorCode::comm, "MPI_Init_thread failed");
    }
    owns_ = true;
  }
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
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

WorldErrorsReturn::WorldErrorsReturn() : saved_(nullptr) {
  static_assert(sizeof(MPI_Errhandler) <= sizeof(void*), "MPI_Errhandler must fit a pointer");
  MPI_Errhandler saved = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &saved);
  std::memcpy(&saved_, &saved, sizeof(saved));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

WorldErrorsReturn::~WorldErrorsReturn() {
  MPI_Errhandler saved = MPI_ERRHANDLER_NULL;
  std::memcpy(&saved, &saved_, sizeof(saved));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, saved);
  MPI_Errhandler_free(&saved);  // the reference MPI_Comm_get_errhandler returned
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace comm
}  // namespace shardopt
