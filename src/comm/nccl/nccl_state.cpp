// src/comm/nccl/nccl_state.cpp — the bounded waits of a NCCL communicator and its pending collectives, and the abort that poisons it after a failure.
#include "comm/nccl/nccl_state.hpp"

#include "comm/watchdog.hpp"

namespace shardopt {
namespace comm {

std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* detail = ncclGetLastError(comm);
  if (detail != nullptr && *detail != '\0') text += fmt::format(" ({})", detail);
  return text;
}

void check_cuda(cudaError_t status, const char* what, int rank) {
  if (status != cudaSuccess) {
    raise(ErrorCode::cuda, "{} failed on rank {}: {} ({})", what, rank, cudaGetErrorString(status),
          cudaGetErrorName(status));
  }
}

cudaEvent_t NcclState::acquire_event() {
  {
    const std::lock_guard<std::mutex> lock(events_mutex);
    if (!free_events.empty()) {
      cudaEvent_t event = free_events.back();
      free_events.pop_back();
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  check_cuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate", rank);
  return event;
}

void NcclState::release_event(cudaEvent_t event) noexcept {
  // An event whose work is still pending can be recorded again later: a record replaces the
  // previous one, and nobody waits on the old one any more.
  try {
    const std::lock_guard<std::mutex> lock(events_mutex);
    free_events.push_back(event);
  } catch (...) {
    cudaEventDestroy(event);
  }
}

NcclState::~NcclState() {
  for (cudaEvent_t event : free_events) cudaEventDestroy(event);
  if (barrier_word != nullptr) cudaFree(barrier_word);
  if (comm == nullptr) return;
  // Finalize flushes our outstanding work and waits for the peers to be quiescent; if they
  // never are (a peer died), abort instead of hanging in a destructor.
  ncclResult_t state = ncclCommFinalize(comm);
  if (state == ncclInProgress) {
    const Deadline deadline(options.timeout_seconds);
    poll_until(deadline, [&] {
      ncclCommGetAsyncError(comm, &state);
      return state != ncclInProgress;
    });
  }
  if (state == ncclSuccess) {
    ncclCommDestroy(comm);
  } else {
    ncclCommAbort(comm);
  }
}

void NcclState::check_usable(const char* op) const {
  if (abort_reason.empty()) return;
  throw Error(abort_code, fmt::format("{} on rank {} of {} (nccl) refused: the communicator was "
                                      "aborted after an earlier failure ({}); create a new one",
                                      op, rank, size, abort_reason));
}

void NcclState::abort_and_raise(ErrorCode code, const std::string& message) {
  if (comm != nullptr) ncclCommAbort(comm);
  comm = nullptr;
  if (abort_reason.empty()) {
    abort_reason = message;
    abort_code = code;
  }
  throw Error(code, message);
}

void NcclState::settle(ncclResult_t result, const char* op) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) {
    raise(ErrorCode::comm, "{} on rank {} of {} (nccl, cuda:{}) failed: {}", op, rank, size,
          device, nccl_error_text(result, comm));
  }
  const Deadline deadline(options.timeout_seconds);
  ncclResult_t state = ncclInProgress;
  const bool settled = poll_until(deadline, [&] {
    ncclCommGetAsyncError(comm, &state);
    return state != ncclInProgress;
  });
  if (!settled) {
    abort_and_raise(ErrorCode::timeout,
                    fmt::format("{} on rank {} of {} (nccl, cuda:{}) did not complete within "
                                "{:g} s (NCCL kept reporting ncclInProgress: a peer is missing "
                                "or stuck); the NCCL communicator was aborted",
                                op, rank, size, device, deadline.seconds()));
  }
  if (state != ncclSuccess) {
    abort_and_raise(ErrorCode::comm,
                    fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed: {}", op, rank,
                                size, device, nccl_error_text(state, comm)));
  }
}

void NcclPending::wait() {
  if (event_ == nullptr) return;
  NcclState& s = *state_;
  s.check_usable(op_);
  const Deadline deadline(s.options.timeout_seconds);
  cudaError_t cuda_status = cudaErrorNotReady;
  ncclResult_t nccl_status = ncclSuccess;
  const bool finished = poll_until(deadline, [&] {
    cuda_status = cudaEventQuery(event_);
    if (cuda_status != cudaErrorNotReady) return true;
    // A peer that failed or vanished shows up here long before any deadline.
    ncclCommGetAsyncError(s.comm, &nccl_status);
    return nccl_status != ncclSuccess && nccl_status != ncclInProgress;
  });
  if (!finished) {
    s.abort_and_raise(ErrorCode::timeout,
                      fmt::format("{} on rank {} of {} (nccl, cuda:{}) did not complete within "
                                  "{:g} s: a peer is dead, stuck, or issued a different "
                                  "collective; the NCCL communicator was aborted",
                                  op_, s.rank, s.size, s.device, deadline.seconds()));
  }
  if (cuda_status == cudaErrorNotReady) {
    s.abort_and_raise(ErrorCode::comm,
                      fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed: {}; the NCCL "
                                  "communicator was aborted",
                                  op_, s.rank, s.size, s.device,
                                  nccl_error_text(nccl_status, s.comm)));
  }
  if (cuda_status != cudaSuccess) {
    s.abort_and_raise(ErrorCode::cuda,
                      fmt::format("{} on rank {} of {} (nccl, cuda:{}) failed on the device: {} "
                                  "({}); the NCCL communicator was aborted",
                                  op_, s.rank, s.size, s.device, cudaGetErrorString(cuda_status),
                                  cudaGetErrorName(cuda_status)));
  }
  s.release_event(event_);
  event_ = nullptr;
}

}  // namespace comm
}  // namespace shardopt
