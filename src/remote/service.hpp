// src/remote/service.hpp — an owner's service thread: receives trainers' requests, logs pushes and sums them when idle, applies stepped contexts (in arrival or deterministic order), answers pulls, expires what dead trainers left.
#pragma once

#include <mpi.h>

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "remote/owner_store.hpp"
#include "shardopt/error.hpp"

namespace shardopt {
namespace remote {

class Service {
 public:
  // Starts the thread. `store` is the service's alone from here until join() returns.
  Service(MPI_Comm comm, const Directory& directory, OwnerStore& store, const RemoteOptions& options);
  ~Service();  // stops and joins
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  // Waits until every trainer has finished or gone silent for context_expiry_seconds.
  void join();
  // Ends the thread after its current request (the owner is going away).
  void stop();
  RemoteStats stats() const;
  // Held by the thread while it handles a request: hold it to read or replace the store's
  // contents between requests (checkpoints).
  std::mutex& store_mutex() { return store_mutex_; }

 private:
  struct PendingStep {
    RequestHeader header;
    std::vector<int32_t> touched;
  };
  struct TrainerState {
    Clock::time_point last_heard = Clock::now();
    bool finished = false;
    int64_t steps_total = -1;  // steps it issued, known once it finished
    int64_t applied = 0;       // its steps applied here (deterministic order)
    bool gone = false;
    std::map<int64_t, PendingStep> waiting;  // deterministic: steps waiting for their turn, by number
    std::set<int64_t> expired;               // contexts expired here (for the step's message)
  };
  struct Reply {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<char> bytes;
    Clock::time_point sent = Clock::now();
  };

  void run();
  bool receive_one();  // false when no request was waiting
  void handle(int source, const char* data, std::size_t bytes);
  void handle_push(int source, const RequestHeader& h, const char* payload, std::size_t bytes);
  void handle_step(int source, const RequestHeader& h, const char* payload, std::size_t bytes);
  void handle_pull(int source, const RequestHeader& h, const char* payload, std::size_t bytes);
  void apply_step(int source, const PendingStep& step);
  void refuse(OwnerContext& context, const RequestHeader& h, const Error& e);  // nothing of it applied
  void fold_one(OwnerContext& context);  // sums the context's oldest logged push
  void fold_all(OwnerContext& context);
  bool fold_while_idle();  // sums one logged push of some context; false when none is logged
  void drain_deterministic();
  void housekeeping();
  int64_t drop_trainer_contexts(int trainer);  // its open contexts; returns how many
  bool all_trainers_done() const;
  void reply(int dest, int64_t request_id, int code, const std::string& message, const void* data = nullptr,
             std::size_t bytes = 0);
  void update_memory_stats();
  bool deterministic() const { return options_.order == RemoteOrder::deterministic; }

  MPI_Comm comm_;
  const Directory& directory_;
  OwnerStore& store_;
  RemoteOptions options_;
  MessagePool messages_;  // before contexts_: their logs give their buffers back to it
  std::map<std::pair<int, int64_t>, OwnerContext> contexts_;
  std::map<int, TrainerState> trainers_;
  std::list<Reply> replies_;
  std::vector<char> scratch_;
  std::atomic<bool> stop_{false};
  std::mutex store_mutex_;
  mutable std::mutex stats_mutex_;
  RemoteStats stats_;
  std::thread thread_;
};

}  // namespace remote
}  // namespace shardopt
