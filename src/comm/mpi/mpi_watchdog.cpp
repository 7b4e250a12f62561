// src/comm/mpi/mpi_watchdog.cpp — the bounded wait on MPI requests, the poisoning of a communicator after a timeout, and its teardown.
#include "comm/mpi/mpi_watchdog.hpp"

#include <utility>

#include "comm/watchdog.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace comm {

MpiCommState::MpiCommState(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent,
                           const CommOptions& options)
    : runtime_(std::move(runtime)), options_(options) {
  MPI_Comm_rank(parent, &rank_);
  MPI_Comm_size(parent, &size_);
  meet_on(parent);
  check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  check(peers_.gather(comm_, rank_), "MPI_Allgather of the ranks' hosts");
}

void MpiCommState::meet_on(MPI_Comm parent) {
  // The parent is the caller's communicator: its handler is left as it is, and a barrier that
  // times out stays live on it (MPI cannot cancel it), as the caller's own collectives would.
  int code = MPI_SUCCESS;
  bool done = false;
  {
    const ErrorsReturn parent_errors(parent);
    MPI_Request request = MPI_REQUEST_NULL;
    code = MPI_Ibarrier(parent, &request);
    if (code == MPI_SUCCESS) code = test_until(request, Deadline(options_.timeout_seconds), done);
  }
  SHARDOPT_CHECK(code == MPI_SUCCESS, comm, "creating a communicator on rank {} of {}: the ranks' meeting failed in MPI: {}",
                 rank_, size_, mpi_error_string(code));
  SHARDOPT_CHECK(done, timeout,
                 "creating a communicator on rank {} of {}: not every rank arrived within {:g} s (a peer is dead, "
                 "unreachable, or did not create it)",
                 rank_, size_, options_.timeout_seconds);
}

MpiCommState::~MpiCommState() {
  core::AbandonedMemory& abandoned = core::AbandonedMemory::process();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    // MPI can touch nothing any more.
    for (const LiveRequest& live : live_requests_) abandoned.release(live.hold);
    return;
  }
  if (comm_ == MPI_COMM_NULL) return;
  bool still_live = false;
  const ErrorsReturn world_errors;
  for (LiveRequest& live : live_requests_) {
    int done = 0;
    if (MPI_Test(&live.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) {
      still_live = true;
    } else {
      abandoned.release(live.hold);  // the late peer came: its memory may be freed now
    }
  }
  // A collective that is still live uses the communicator: it is left to MPI (not freed), as
  // its request is, rather than risk MPI tearing either down under a late peer's traffic. Its
  // memory stays held until MPI is finalised (MpiRuntime), or until the process exits.
  if (!still_live) MPI_Comm_free(&comm_);
}

void MpiCommState::check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  unusable_ = fmt::format("{} failed on rank {} of {}: {}", call, rank_, size_,
                          mpi_error_string(code));
  unusable_code_ = ErrorCode::comm;
  raise(ErrorCode::comm, "{}; the communicator is now unusable", unusable_);
}

void MpiCommState::check_usable(const char* op) const {
  if (unusable_.empty()) return;
  raise(unusable_code_,
        "{} on rank {} of {} refused: this MPI communicator is unusable since an earlier "
        "collective {} ({}); that collective's request may still be live in MPI, so create a new "
        "communicator",
        op, rank_, size_, unusable_code_ == ErrorCode::timeout ? "timed out" : "failed",
        unusable_);
}

void MpiCommState::wait(MPI_Request& request, const char* op, const TouchedMemory& touched) {
  if (request == MPI_REQUEST_NULL) return;
  const Deadline deadline(options_.timeout_seconds);
  bool done = false;
  const int code = test_until(request, deadline, done);
  if (code == MPI_SUCCESS && done) return;
  // Only a failed or timed-out wait asks which peers of this host still run: the probe costs a
  // kill(2) and a /proc read per peer, too much for every successful collective.
  const std::string missing = peers_.describe_missing();
  if (code != MPI_SUCCESS) {
    keep_live(request, touched);
    request = MPI_REQUEST_NULL;
    unusable_ = fmt::format("{} on rank {} of {} failed in MPI: {}{}", op, rank_, size_,
                            mpi_error_string(code), missing);
    unusable_code_ = ErrorCode::comm;
      raise(ErrorCode::comm, "{}. {}; the communicator is now unusable", unusable_,
          missing.empty() ? "The ranks issued different collectives (a peer is in another "
                            "shardopt call or called the communicator directly), or a peer died "
                            "or its link failed"
                          : "A peer died");
  }
  unusable_ = fmt::format("{} on rank {} of {} did not complete within {:g} s{}", op, rank_,
                          size_, deadline.seconds(), missing);
  unusable_code_ = ErrorCode::timeout;
  live_requests_.push_back(LiveRequest{request, core::AbandonedMemory::process().hold(touched.data(), touched.size())});
  request = MPI_REQUEST_NULL;
  raise(ErrorCode::timeout,
        "{}. {}; the communicator is now unusable (MPI cannot cancel the collective, so its "
        "buffers may still be written if the peer arrives late)",
        unusable_,
        missing.empty() ? "A peer is dead, stuck, or issued a different collective" : "A peer died");
}

void MpiCommState::keep_live(MPI_Request request, const TouchedMemory& touched) {
  if (request == MPI_REQUEST_NULL) return;
  int done = 0;
  int code = MPI_SUCCESS;
  {
    const ErrorsReturn world_errors;
    code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  }
  if (code == MPI_SUCCESS && done) return;
  live_requests_.push_back(LiveRequest{request, core::AbandonedMemory::process().hold(touched.data(), touched.size())});
}

MpiPending::~MpiPending() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) state_->keep_live(request_, touched_);
}

void MpiPending::wait() {
  if (request_ == MPI_REQUEST_NULL) return;
  state_->check_usable(op_);
  state_->wait(request_, op_, touched_);
  if (finish) {
    const std::function<void()> last_step = std::move(finish);
    finish = nullptr;
    last_step();
  }
}

}  // namespace comm
}  // namespace shardopt
