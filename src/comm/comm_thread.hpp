// src/comm/comm_thread.hpp — one communication thread that runs submitted work in FIFO order, and a Communicator whose every call runs on it.
//
// Why one thread for every call: the collectives a process issues must be in the same order
// on all ranks, and an MPI library needs only MPI_THREAD_SERIALIZED when no two threads call
// it at once. With every call of a communicator (and of the communicators split from it)
// queued on one thread, both hold by construction: the caller keeps computing while queued
// collectives progress, and waits on a Ticket only where it needs a result.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "shardopt/communicator.hpp"

namespace shardopt {
namespace comm {

// The completion of one piece of queued work: wait() returns once it ran, rethrowing its error.
class Ticket {
 public:
  void wait();
  bool done() const;

 private:
  friend class CommThread;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CommThread {
 public:
  CommThread();
  // Runs what is still queued, then joins the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `work` behind everything submitted before. Called on the thread itself (work that
  // submits more work), it runs at once instead: waiting for it there would never end.
  std::shared_ptr<Ticket> submit(std::function<void()> work);
  // submit() and wait.
  void run(std::function<void()> work) { submit(std::move(work))->wait(); }
  // Runs `work` on the calling thread now; the ticket it returns is done and holds its error
  // (for callers whose work only enqueues on a device stream and needs no thread).
  static std::shared_ptr<Ticket> run_here(const std::function<void()>& work);
  // Waits until everything submitted so far has run (errors stay with their tickets).
  void drain();
  bool on_this_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Item {
    std::function<void()> work;
    std::shared_ptr<Ticket> ticket;
  };
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// Raises where `comm`'s transport cannot be called from a thread other than the one that
// initialised it (CommBackend::require_serialized_calls).
void require_serialized_calls(const Communicator& comm);

// Every call of `inner` (and of the communicators split from this one) runs on `thread`; the
// async forms queue the blocking call and return a handle on its Ticket. Errors (timeouts,
// a poisoned communicator) reach the caller from wait(), as they would without the thread.
std::shared_ptr<Communicator> serialize_on(std::shared_ptr<Communicator> inner, std::shared_ptr<CommThread> thread);

}  // namespace comm
}  // namespace shardopt
