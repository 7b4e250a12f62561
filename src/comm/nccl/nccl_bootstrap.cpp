// src/comm/nccl/nccl_bootstrap.cpp — setting up NCCL communicators over MPI (device choice, the unique id, init with a deadline): nccl_world and nccl_borrow.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "comm/mpi/mpi_runtime.hpp"
#include "comm/nccl/nccl_communicator.hpp"
#include "comm/nccl/nccl_loader.hpp"
#include "comm/nccl/nccl_state.hpp"
#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "core/device_memory.hpp"
#include "shardopt/nccl.hpp"

namespace shardopt {
namespace comm {
namespace {

// The bootstrap's own duplicate of the caller's communicator: its traffic cannot match the
// caller's messages, and MPI errors come back as codes instead of killing the job.
class BootstrapComm {
 public:
  BootstrapComm(MPI_Comm parent, const CommOptions& options) : options_(options) {
    MPI_Comm_rank(parent, &rank_);
    MPI_Comm_size(parent, &size_);
    // Everyone must arrive before the blocking MPI_Comm_dup / MPI_Comm_split_type below, so a
    // rank that never calls nccl_world turns into a timeout here rather than a hang there.
    MPI_Request request;
    check(MPI_Ibarrier(parent, &request), "MPI_Ibarrier");
    wait(request, "MPI_Ibarrier");
    check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~BootstrapComm() {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  BootstrapComm(const BootstrapComm&) = delete;
  BootstrapComm& operator=(const BootstrapComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  void check(int code, const char* call) const {
    if (code != MPI_SUCCESS) {
      raise(ErrorCode::comm, "nccl bootstrap: {} failed on rank {} of {}: {}", call, rank_, size_,
            mpi_error_string(code));
    }
  }

  void wait(MPI_Request& request, const char* call) const {
    const Deadline deadline(options_.timeout_seconds);
    bool done = false;
    check(test_until(request, deadline, done), call);
    if (!done) {
      raise(ErrorCode::timeout,
            "nccl bootstrap: {} on rank {} of {} did not complete within {:g} s: a rank did not "
            "call nccl_world/nccl_borrow, or is stuck",
            call, rank_, size_, deadline.seconds());
    }
  }

 private:
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

struct LocalSetup {
  int device = -1;
  std::string error;  // empty when this rank is ready
  ErrorCode code = ErrorCode::cuda;
};

LocalSetup choose_device(int local_rank, int local_size, void* stream) {
  LocalSetup setup;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    // unusable_reason's words: it tells a missing driver from an unusable device.
    const std::string reason = device::unusable_reason(Device::cuda(0));
    setup.error = fmt::format("no CUDA device: {}",
                              !reason.empty() ? reason : "cudaGetDeviceCount reported 0 devices");
    return setup;
  }
  if (stream != nullptr) {
    // The caller chose the device when it made the stream.
    const cudaError_t got = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &setup.device);
    if (got != cudaSuccess) {
      cudaGetLastError();
      setup.error = fmt::format("the given stream is not usable: {}", cudaGetErrorString(got));
    }
    return setup;
  }
  if (local_size > count) {
    setup.error = fmt::format(
        "{} ranks share this node but it has {} CUDA device(s); NCCL needs one device per rank",
        local_size, count);
    setup.code = ErrorCode::unsupported;
    return setup;
  }
  setup.device = local_rank % count;
  return setup;
}

std::shared_ptr<Communicator> bootstrap(MPI_Comm parent, const CommOptions& options, void* stream,
                                        std::shared_ptr<Communicator> mpi_keepalive) {
  BootstrapComm boot(parent, options);
  const int rank = boot.rank();
  const int size = boot.size();

  MPI_Comm node = MPI_COMM_NULL;
  boot.check(MPI_Comm_split_type(boot.comm(), MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
             "MPI_Comm_split_type");
  int local_rank = 0;
  int local_size = 1;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);

  LocalSetup setup = choose_device(local_rank, local_size, stream);
  auto stream_holder = std::make_shared<StreamHolder>();
  ncclUniqueId id{};
  if (setup.error.empty()) {
    const cudaError_t status = cudaSetDevice(setup.device);
    if (status != cudaSuccess) {
      setup.error = fmt::format("cudaSetDevice({}) failed: {}", setup.device,
                                cudaGetErrorString(status));
    } else if (stream != nullptr) {
      stream_holder->stream = static_cast<cudaStream_t>(stream);
    } else {
      // A blocking stream: work the caller enqueued on the legacy default stream before a
      // call (a cudaMemcpy into the buffer, kernels on stream 0) runs before the collective,
      // and legacy-stream reads after a wait() see its result, as with host buffers.
      const cudaError_t made = cudaStreamCreateWithFlags(&stream_holder->stream, cudaStreamDefault);
      if (made == cudaSuccess) {
        stream_holder->owned = true;
      } else {
        setup.error = fmt::format("cudaStreamCreate failed: {}", cudaGetErrorString(made));
      }
    }
  }
  if (setup.error.empty() && rank == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      setup.error = fmt::format("ncclGetUniqueId failed: {}", nccl_error_text(result, nullptr));
      setup.code = ErrorCode::comm;
    }
  }

  // Agree on readiness first: a rank that cannot take part makes every rank raise (naming
  // it) instead of leaving the others waiting inside NCCL's init.
  int ready = setup.error.empty() ? 1 : 0;
  std::vector<int> all_ready(static_cast<std::size_t>(size), 0);
  MPI_Request request;
  boot.check(MPI_Iallgather(&ready, 1, MPI_INT, all_ready.data(), 1, MPI_INT, boot.comm(), &request),
             "MPI_Iallgather");
  boot.wait(request, "MPI_Iallgather");
  if (!setup.error.empty()) {
    raise(setup.code, "nccl bootstrap on rank {} of {} (node-local rank {}): {}", rank, size,
          local_rank, setup.error);
  }
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (all_ready[static_cast<std::size_t>(r)] == 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    raise(ErrorCode::comm,
          "nccl bootstrap on rank {} of {}: rank(s) {} could not set up (see their errors); no "
          "communicator was created",
          rank, size, failed);
  }

  boot.check(MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, boot.comm(), &request),
             "MPI_Ibcast");
  boot.wait(request, "MPI_Ibcast(ncclUniqueId)");

  auto state = std::make_shared<NcclState>();
  state->device = setup.device;
  state->stream = std::move(stream_holder);
  state->options = options;
  state->rank = rank;
  state->size = size;
  state->mpi_keepalive = std::move(mpi_keepalive);
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t result = ncclCommInitRankConfig(&state->comm, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    ncclComm_t comm = state->comm;
    state->comm = nullptr;
    if (comm != nullptr) ncclCommAbort(comm);
    raise(ErrorCode::comm, "ncclCommInitRank on rank {} of {} (cuda:{}) failed: {}", rank, size,
          setup.device, nccl_error_text(result, nullptr));
  }
  state->settle(result, "ncclCommInitRank");
  finish_nccl_state(*state);
  return make_nccl_communicator(std::move(state));
}

}  // namespace
}  // namespace comm

bool nccl_compiled_in() { return true; }

std::shared_ptr<Communicator> nccl_world(const CommOptions& options, void* stream) {
  comm::check_timeout_option(options, "nccl_world");
  comm::require_nccl_library("nccl_world");
  // mpi_world() initialises MPI when nobody has; MPI then stays initialised until the process
  // exits. The bootstrap runs over MPI_COMM_WORLD, which needs MPI initialised.
  std::shared_ptr<Communicator> host = mpi_world(options);
  return comm::bootstrap(MPI_COMM_WORLD, options, stream, std::move(host));
}

std::shared_ptr<Communicator> nccl_borrow(const void* mpi_comm, const CommOptions& options,
                                          void* stream) {
  SHARDOPT_CHECK(mpi_comm != nullptr, invalid_argument, "nccl_borrow: the MPI_Comm pointer is null");
  comm::check_timeout_option(options, "nccl_borrow");
  comm::require_nccl_library("nccl_borrow");
  int initialized = 0;
  MPI_Initialized(&initialized);
  SHARDOPT_CHECK(initialized, comm,
                 "nccl_borrow: MPI is not initialised; the caller owns MPI in this mode");
  return comm::bootstrap(*static_cast<const MPI_Comm*>(mpi_comm), options, stream, nullptr);
}

}  // namespace shardopt
