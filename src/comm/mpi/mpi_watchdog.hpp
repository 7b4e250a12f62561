// src/comm/mpi/mpi_watchdog.hpp — what an MPI communicator shares with its pending collectives: the bounded wait, and the poisoning after a timeout.
//
// A collective that does not complete within CommOptions.timeout_seconds raises Error(timeout)
// and poisons its communicator. MPI forbids MPI_Cancel and MPI_Request_free on nonblocking
// collectives, so the timed-out request stays live: MPI may still read and write its buffers
// if the missing peer arrives late. The state keeps that request, and every later call on the
// communicator or on any of its pending handles raises Error(timeout) at once, naming the
// operation that timed out, instead of issuing collectives that can no longer match the peers'.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_runtime.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// A communicator's duplicate MPI_Comm and everything its pending collectives need, held by
// shared_ptr so that a pending collective may outlive its communicator. Used from one thread
// (shardopt initialises MPI with MPI_THREAD_FUNNELED), so there is no lock.
class MpiCommState {
 public:
  // Duplicates `parent` (collective over it) and makes MPI return errors instead of aborting.
  MpiCommState(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent, const CommOptions& options);
  ~MpiCommState();
  MpiCommState(const MpiCommState&) = delete;
  MpiCommState& operator=(const MpiCommState&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  const std::shared_ptr<MpiRuntime>& runtime() const { return runtime_; }

  // Error(comm) naming `call`, the rank and MPI's text unless `code` is MPI_SUCCESS.
  void check(int code, const char* call) const;
  // Error(timeout) when an earlier collective timed out, naming it; `op` is the refused call.
  void check_usable(const char* op) const;
  // Polls `request` until it completes (it becomes MPI_REQUEST_NULL) or the timeout passes;
  // then poisons this state, keeps the request and raises Error(timeout) naming `op`.
  void wait(MPI_Request& request, const char* op);
  // Keeps a request that nobody will wait for (a dropped or refused handle) unless it has
  // completed already: it may not be freed, and its communicator must outlive it.
  void keep_live(MPI_Request request);

 private:
  std::shared_ptr<MpiRuntime> runtime_;  // null for a borrowed communicator
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::string timed_out_;                // what timed out, in words; empty while usable
  std::vector<MPI_Request> live_requests_;
};

// A collective started by a nonblocking MPI call.
class MpiPending final : public PendingCollective {
 public:
  MpiPending(std::shared_ptr<MpiCommState> state, const char* op, MPI_Request request)
      : state_(std::move(state)), op_(op), request_(request) {}
  ~MpiPending() override;
  MpiPending(const MpiPending&) = delete;
  MpiPending& operator=(const MpiPending&) = delete;

  // Runs once after completion (avg's division by the world size).
  std::function<void()> finish;
  void wait() override;

 private:
  std::shared_ptr<MpiCommState> state_;
  const char* op_;
  MPI_Request request_;
};

}  // namespace comm
}  // namespace shardopt
