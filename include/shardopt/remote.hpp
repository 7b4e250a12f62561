// shardopt/remote.hpp — RemoteOptimizer: parameters that live on their owners, gradients pushed by trainers into contexts, step(context) run where the parameters are (torch's RPC DistributedOptimizer over MPI).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardopt/communicator.hpp"
#include "shardopt/export.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {

// One parameter (or this owner's rows of one) that this rank owns: a matrix of `rows` rows of
// `row_size` f32 elements (a vector is rows = numel, row_size = 1). An owner holds rows
// [row_begin, row_end); the owners of one name must together hold every row exactly once, with
// the same rows, row_size, algorithm and hyperparameters.
struct RemoteParamSpec {
  std::string name;
  int64_t rows = 0;
  int64_t row_size = 1;
  int64_t row_begin = 0;
  int64_t row_end = -1;           // -1: rows (the whole parameter)
  // (row_end - row_begin) * row_size values, copied (from host or, in a CUDA build, CUDA device
  // memory); null: zeros
  const float* initial = nullptr;
};

struct RemoteGroupSpec {
  Algorithm algorithm = Algorithm::adam;
  GroupHyperparams hyper;  // unset fields: default_hyperparams(algorithm)
  std::vector<RemoteParamSpec> params;
};

// The order in which an owner applies the contexts trainers step.
enum class RemoteOrder : int32_t {
  // As they arrive, one at a time per owner (torch's DistributedOptimizer): nothing orders
  // them across owners or trainers.
  arrival = 0,
  // Each owner applies the n-th step() of every trainer before any trainer's (n+1)-th, and
  // within one n by trainer rank: a trainer's n-th step waits on each owner until every
  // trainer of lower rank has stepped n times there (or finished). For the same gradients a
  // run repeats bit for bit. A trainer silent for context_expiry_seconds leaves the order
  // (see RemoteOptions), so a dead trainer delays the others by that much at most.
  deterministic = 1,
};

// Every rank passes the same values, except `trainer`.
struct RemoteOptions {
  bool trainer = true;  // this rank pushes gradients and steps contexts
  RemoteOrder order = RemoteOrder::arrival;
  // A trainer call (step, pull, close's hand-over) that waits on an owner longer than this
  // raises Error(timeout) naming the owner (one that died, or stopped serving).
  double timeout_seconds = 60.0;
  // An owner drops a trainer's open context untouched this long (its accumulated gradients
  // are freed; stepping it later raises Error(invalid_argument) naming it expired), and
  // counts a trainer silent this long as gone: it leaves the deterministic order, and an
  // owner's close() stops waiting for it.
  double context_expiry_seconds = 120.0;
  // Contexts one trainer may have open at once (each holds, on each owner it pushed to, an
  // f32 accumulator of the parameters it pushed): bounds the owners' memory.
  int max_open_contexts = 8;
  int cpu_threads = 0;  // OpenMP threads of the owners' update; 0: OpenMP's default
  // An owner keeps each push as received (its message) and sums it into the context's f32
  // accumulator later, in arrival order (the same bits as summing at once): when no request
  // has come for 200 us, or at the context's step. Past this many logged bytes in one context it
  // sums that context's log at once, so each context holds at most this much (plus one push)
  // beyond its sums, and the owner keeps at most this much of freed message buffers for reuse.
  // 0: every push is summed as it arrives.
  int64_t push_log_bytes = int64_t{64} << 20;
};

// A parameter as a trainer names it (RemoteOptimizer::lookup). A handle of another optimizer,
// or a made-up one, is refused by name (Error(invalid_argument)).
struct RemoteParam {
  int32_t id = -1;
  int64_t rows = 0;
  int64_t row_size = 0;
  uint64_t check = 0;
  int64_t numel() const { return rows * row_size; }
};

using RemoteContext = int64_t;

// What this rank's owner side has done (getters: no communication).
struct RemoteStats {
  int64_t pushes_received = 0;
  int64_t bytes_received = 0;   // request payloads (gradients, row indices)
  int64_t contexts_applied = 0;
  int64_t contexts_failed = 0;  // stepped, but refused (an invalid push): nothing applied
  int64_t contexts_expired = 0;
  int64_t trainers_gone = 0;    // counted as gone after context_expiry_seconds of silence
  int64_t open_contexts = 0;    // contexts holding accumulators now
  int64_t accumulator_bytes = 0;
  // Buffers of applied contexts' sums kept for the next contexts (bounded: SumPool's kKept of
  // each kind); with accumulator_bytes, what the owner holds beyond its table and state.
  int64_t pooled_bytes = 0;
  int64_t logged_bytes = 0;  // pushes received and not yet summed (part of accumulator_bytes)
};

class RemoteOptimizer;

// A step in flight (RemoteOptimizer::step_async).
class SHARDOPT_API RemoteStepHandle {
 public:
  RemoteStepHandle();
  ~RemoteStepHandle();
  RemoteStepHandle(RemoteStepHandle&&) noexcept;
  RemoteStepHandle& operator=(RemoteStepHandle&&) noexcept;
  // Returns once every owner has applied the context; raises the first owner's refusal, or
  // Error(timeout) naming an owner that did not answer within timeout_seconds. Once only.
  void wait();

  struct State;

 private:
  friend class RemoteOptimizer;
  std::unique_ptr<State> state_;
};

// Over an MPI communicator (mpi_world, mpi_borrow): every rank constructs it with the same
// options; owners pass the groups they own (a rank may own nothing, train, or both).
// The owners serve requests on a thread of their own while the caller computes, which needs
// MPI initialised with MPI_THREAD_MULTIPLE (remote_mpi_world() initialises it so; a process
// whose MPI provides less is refused by name, Error(unsupported), on every rank). The service
// thread never spins while idle: it polls with sleeps that back off to 1 ms.
class SHARDOPT_API RemoteOptimizer {
 public:
  // Collective over `comm`: validation and the directory of parameters (names, row ranges,
  // owners) are agreed, so a bad spec on one rank, or owners that disagree on a parameter,
  // raise the same Error on every rank.
  RemoteOptimizer(std::shared_ptr<Communicator> comm, std::vector<RemoteGroupSpec> owned,
                  RemoteOptions options = {});
  // Calls close() if it has not been called (swallowing its error).
  ~RemoteOptimizer();
  RemoteOptimizer(const RemoteOptimizer&) = delete;
  RemoteOptimizer& operator=(const RemoteOptimizer&) = delete;

  // Local. Error(invalid_argument) naming the name when no owner registered it.
  RemoteParam lookup(const std::string& name) const;
  std::vector<std::string> param_names() const;  // every registered name, sorted
  // The ranks owning parameter `param`, by row range: {owner, row_begin, row_end} per slice.
  std::vector<std::array<int64_t, 3>> owners(const RemoteParam& param) const;

  // ---- trainer calls (this rank constructed with options.trainer) ----
  // Their buffers may be host memory or, in a build with CUDA, CUDA device memory, which is
  // copied through host memory when the call is made (see docs/remote.md).
  // A new gradient context. Error(invalid_argument) when max_open_contexts are open.
  RemoteContext open_context();
  // Adds `numel` values (the whole parameter, row-major) to the context's gradient of `param`
  // on its owners (summed there in f32, in push order). Asynchronous: `grad` is read until
  // the context's step has been waited for (step() returned, or step_async's wait()): do not
  // change or free it before.
  void push(RemoteContext context, const RemoteParam& param, const float* grad, int64_t numel);
  // Adds `count` rows: values[i*row_size ..] to row rows[i] (repeated rows add in order).
  // Asynchronous like push: `rows` and `values` are read until the step has been waited for.
  void push_rows(RemoteContext context, const RemoteParam& param, const int64_t* rows, int64_t count,
                 const float* values);
  // Applies the context on every owner: each parameter pushed into it (on any of its rows) takes
  // one step of its algorithm, over the summed gradient (zeros on rows nobody pushed), on every
  // owner of it; the others are left as they are. Returns when every owner has finished. A
  // context that was stepped already, expired or never opened: Error(invalid_argument), nothing
  // sent. An owner that refused a push of it (see push): Error(invalid_argument) naming the
  // owner and the push, nothing applied on that owner.
  void step(RemoteContext context);
  RemoteStepHandle step_async(RemoteContext context);
  // The parameter's current values (numel of them), or the rows named (count * row_size).
  void pull(const RemoteParam& param, float* out, int64_t numel);
  void pull_rows(const RemoteParam& param, const int64_t* rows, int64_t count, float* out);

  // Ends this rank's part. A trainer tells every owner it has finished (open contexts are
  // dropped); an owner then serves the other trainers until each has finished or gone silent
  // for context_expiry_seconds, and returns. Not collective: ranks return as their part ends.
  void close();

  // ---- checkpoints: collective over the communicator (every rank, owning rows or not) ----
  // Call with no step in flight on any trainer (every step() returned, every step_async
  // waited for), so that every owner holds the same steps applied. The parameters of each
  // algorithm are saved to `dir`/<algorithm>/ ("sgd", "adam", "adamw") as one sharded
  // checkpoint of shardopt's format: a shard file per owner of them (its rows' values and
  // state), manifest.json last, written atomically by rank 0 (shardopt-ckpt verify reads it).
  // A failure on any rank raises the same Error on every rank; the previous checkpoint stays.
  void save(const std::string& dir);
  // Restores values, state and step counts from `dir` (the hyperparameters stay the registered ones), whatever rows each owner
  // held when it was saved (resharding to other owners, or to a different count of them). The
  // checkpoint must hold exactly the registered names and sizes under the same algorithms
  // (Error(invalid_argument) on every rank otherwise, nothing changed).
  void load(const std::string& dir);

  RemoteStats stats() const;
  const RemoteOptions& options() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// mpi_world(options) with MPI initialised for MPI_THREAD_MULTIPLE when shardopt initialises it
// (the owners' service thread calls MPI beside the caller's thread). Where MPI is already
// initialised, the same as mpi_world.
SHARDOPT_API std::shared_ptr<Communicator> remote_mpi_world(const CommOptions& options = {});

}  // namespace shardopt
