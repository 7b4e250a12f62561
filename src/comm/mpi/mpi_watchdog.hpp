// src/comm/mpi/mpi_watchdog.hpp — what an MPI communicator shares with its pending collectives: the bounded wait, and the poisoning after a timeout or an MPI error.
//
// A collective that does not complete within CommOptions.timeout_seconds raises Error(timeout)
// and poisons its communicator; one that MPI fails (ranks that issued different collectives
// get MPI_ERR_TRUNCATE, a dead peer a transport error) raises Error(comm) and poisons it too.
// MPI forbids MPI_Cancel and MPI_Request_free on nonblocking collectives, so the request stays
// live: MPI may still read and write its buffers if the peer arrives late. The state keeps that
// request and holds the memory it uses (core/abandoned_memory.hpp: shardopt's own buffers
// there are freed only once the request completed, or MPI was finalised), and every later call on the communicator or on any of its pending handles raises
// the same kind of error at once, naming what failed, instead of issuing collectives that can
// no longer match the peers'.
//
// Open MPI reports a failed nonblocking collective from MPI_Test on MPI_COMM_WORLD, whose
// handler is fatal by default, not on the communicator the collective ran on: every MPI call
// that completes or starts shardopt's collectives therefore runs under ErrorsReturn (mpi_runtime.hpp).
#pragma once

#include <mpi.h>

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi/mpi_runtime.hpp"
#include "comm/mpi/peer_liveness.hpp"
#include "core/abandoned_memory.hpp"
#include "shardopt/communicator.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace comm {

// The memory a collective's request reads or writes: its send and receive buffers (either may
// be empty).
using TouchedMemory = std::array<core::ByteRange, 2>;

// A communicator's duplicate MPI_Comm and everything its pending collectives need, held by
// shared_ptr so that a pending collective may outlive its communicator. Used from one thread
// at a time (shardopt initialises MPI with MPI_THREAD_SERIALIZED: the caller, or with
// config.overlap its communication thread), so there is no lock.
class MpiCommState {
 public:
  // Duplicates `parent` (collective over it), makes MPI return errors instead of aborting, and
  // gathers where every rank runs (PeerDirectory).
  MpiCommState(std::shared_ptr<MpiRuntime> runtime, MPI_Comm parent, const CommOptions& options);
  ~MpiCommState();
  MpiCommState(const MpiCommState&) = delete;
  MpiCommState& operator=(const MpiCommState&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  const std::shared_ptr<MpiRuntime>& runtime() const { return runtime_; }

  // Unless `code` is MPI_SUCCESS: poisons this state and raises Error(comm) naming `call`, the
  // rank and MPI's text.
  void check(int code, const char* call);
  // Error(timeout) or Error(comm) when an earlier collective timed out or failed, naming it;
  // `op` is the refused call.
  void check_usable(const char* op) const;
  // Polls `request` until it completes (it becomes MPI_REQUEST_NULL), MPI fails it, or the
  // timeout passes; in the last two cases poisons this state, keeps the request (and holds
  // `touched`) and raises Error(comm) or Error(timeout) naming `op`.
  void wait(MPI_Request& request, const char* op, const TouchedMemory& touched);
  // Keeps a request that nobody will wait for (a dropped or refused handle) unless it has
  // completed already: it may not be freed, its communicator must outlive it, and the memory
  // it touches is held until it completes or MPI is finalised.
  void keep_live(MPI_Request request, const TouchedMemory& touched);

 private:
  // A watched barrier on `parent` before MPI_Comm_dup, which blocks with no deadline: a peer
  // that is dead or unreachable becomes Error(timeout) here instead of a hang there.
  void meet_on(MPI_Comm parent);

  std::shared_ptr<MpiRuntime> runtime_;  // null for a borrowed communicator
  CommOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // What made the communicator unusable, in words, and the error code later calls get; empty
  // while usable.
  std::string unusable_;
  ErrorCode unusable_code_ = ErrorCode::comm;
  struct LiveRequest {
    MPI_Request request;
    core::AbandonedMemory::Hold hold;  // the memory it may still touch
  };
  std::vector<LiveRequest> live_requests_;
  PeerDirectory peers_;  // to name the peers of this host that died, in failure messages
};

// A collective started by a nonblocking MPI call.
class MpiPending final : public PendingCollective {
 public:
  MpiPending(std::shared_ptr<MpiCommState> state, const char* op, MPI_Request request,
             const TouchedMemory& touched = {})
      : state_(std::move(state)), op_(op), request_(request), touched_(touched) {}
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
  TouchedMemory touched_;
};

}  // namespace comm
}  // namespace shardopt
