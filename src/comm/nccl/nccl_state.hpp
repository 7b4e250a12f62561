// src/comm/nccl/nccl_state.hpp — what a NCCL communicator shares with its pending collectives: the NCCL handle, its stream, the bounded waits and the abort after a failure.
//
// NCCL communicators are created non-blocking (ncclConfig_t::blocking = 0): NCCL calls then
// return ncclInProgress instead of blocking inside the library, so every wait (for init, for
// a split, for a collective to be enqueued, and for it to complete: a CUDA event recorded
// after it) is a polling loop with a deadline. When the deadline passes, or NCCL reports an
// asynchronous error, the communicator is aborted (ncclCommAbort frees it and stops its
// kernels) and an Error names the operation and rank, instead of a hang; every later call
// then fails at once with the same code, naming that operation.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/check.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// NCCL's text for `result`, with its last error message for `comm` when it has one.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm);
// Error(cuda) naming `what` and `rank` unless `status` is cudaSuccess.
void check_cuda(cudaError_t status, const char* what, int rank);

// Makes `device` current for a scope: the caller's thread may be working on another device.
class DeviceGuard {
 public:
  DeviceGuard(int device, int rank) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// The stream collectives run on; destroyed with the last communicator using it when we made it.
struct StreamHolder {
  cudaStream_t stream = nullptr;
  bool owned = false;
  ~StreamHolder() {
    if (owned && stream != nullptr) cudaStreamDestroy(stream);
  }
};

// Everything a communicator and its pending collectives share. Pending collectives hold it by
// shared_ptr, so one that outlives its communicator can still be waited on safely.
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::shared_ptr<StreamHolder> stream;
  CommOptions options;
  std::string abort_reason;        // set once the communicator has been aborted
  ErrorCode abort_code = ErrorCode::comm;  // the code of the failure that aborted it
  int32_t* barrier_word = nullptr;  // device scratch for barrier()'s one-element all-reduce
  std::shared_ptr<Communicator> mpi_keepalive;  // keeps MPI initialised while we live (world form)
  std::mutex events_mutex;  // handles may be let go on another thread than the one issuing
  std::vector<cudaEvent_t> free_events;

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  ~NcclState();

  cudaStream_t cuda_stream() const { return stream->stream; }

  // The completion events of pending collectives, reused: a collective takes one from the pool
  // (creating one only when all are in use, so the pool grows to the most collectives ever in
  // flight and then stops) and gives it back when its handle is done with it.
  cudaEvent_t acquire_event();
  void release_event(cudaEvent_t event) noexcept;

  // After an abort every call fails at once, with the code of the failure that caused it
  // (Error(timeout) after a timeout) and a message naming that failure's operation.
  void check_usable(const char* op) const;
  [[noreturn]] void abort_and_raise(ErrorCode code, const std::string& message);

  // A non-blocking communicator may answer ncclInProgress while NCCL finishes taking the call;
  // waits (bounded) until it has, and aborts on failure or timeout.
  void settle(ncclResult_t result, const char* op);
};

class NcclPending final : public PendingCollective {
 public:
  // A null event means there was nothing to do (zero elements).
  NcclPending(std::shared_ptr<NcclState> state, const char* op, cudaEvent_t event)
      : state_(std::move(state)), op_(op), event_(event) {}
  ~NcclPending() override {
    if (event_ != nullptr) state_->release_event(event_);
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;

  void wait() override;
  cudaEvent_t event() const { return event_; }

 private:
  std::shared_ptr<NcclState> state_;
  const char* op_;
  cudaEvent_t event_;
};

}  // namespace comm
}  // namespace shardopt
