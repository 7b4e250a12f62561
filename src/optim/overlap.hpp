// src/optim/overlap.hpp — the overlap engine: gradients handed over as backward produces them, each bucket reduced once complete (on the communication thread, or on the communication stream), the update per bucket or after backward, the all-gathers in forward order, waited for per parameter.
//
// The collectives of all ranks match when the ranks issue them in the same order. The engine
// makes sure they do: the first round issues nothing before reduce_gradients() has the ranks
// agree on the order in which they completed the buckets; that order is kept, and later rounds
// issue a bucket as soon as it and every bucket before it in that order are complete. While a
// rank is in join() the buckets are issued at the end of the round in position order instead
// (the joined rank hands zeros in its own order). Buckets are the layout's positions cut every
// bucket_elements: the same collectives, with the same counts, as the plain reduction, hence
// the same bits.
//
// On one node with node-shared gradient slots (ShardState::node_grad_slots) no collective is
// issued: a rank hands a complete bucket over by counting it in the slots' shared counters, and
// its communication thread sums its own piece of the bucket over the slots as soon as every
// rank of the node has (overlap_slots.cpp): no order to wait for, and the same kernel and sum
// order as the plain reduction over the slots.
//
// Where the work runs:
//  - CPU parameters: every communicator call of the optimizer runs on one communication thread
//    (comm/comm_thread.hpp), in the order issued, because MPI progresses a collective only
//    inside an MPI call; the engine queues each bucket's work there.
//  - CUDA parameters over a stream-ordered communicator (NCCL): the engine's work only enqueues
//    (collectives on the communication stream, copies and updates on the compute stream), so it
//    runs on the caller's thread, in the caller's order, and the device overlaps it with the
//    trainer's kernels. Events created once per layout order the streams per bucket: each
//    bucket's reduction and gather are recorded on the communication stream; the compute stream
//    waits for a reduction only where it uses the result (the average's division, per_bucket's
//    update, a staging buffer's reuse, after_backward's update), and wait_param(id) makes it
//    wait for the gathers of id's buckets: the host never waits.
//  - CUDA parameters over a host communicator: one rank (no collective to overlap) as above;
//    several ranks (a CUDA-aware MPI, whose collectives would make the host wait for the compute
//    stream at every bucket) are refused by check_device_path().
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "comm/comm_thread.hpp"
#include "optim/param_sync.hpp"
#include "optim/step.hpp"

namespace shardopt {
namespace optim {

// The communicator an optimizer with `config` uses: with config.overlap, `comm` serialised on a
// new communication thread, unless the communicator cannot be called from another thread
// (then `comm` itself, and `refused` says why: the constructor's agreement raises it), or it
// runs its collectives on a CUDA stream (then `comm` itself, and no thread: enqueueing does not
// wait for the collective).
struct OverlapComm {
  std::shared_ptr<Communicator> comm;
  std::shared_ptr<comm::CommThread> thread;
  std::optional<Error> refused;
};
OverlapComm overlap_communicator(std::shared_ptr<Communicator> comm, const OptimizerConfig& config);

class OverlapEngine {
 public:
  // Sets `step`'s update driver when config.overlap is not off. `thread`: the communication
  // thread (null over a stream-ordered communicator).
  OverlapEngine(std::shared_ptr<comm::CommThread> thread, const DeviceContext& dev, const OptimizerConfig& config,
                const ParamTable& table, ShardState& shard, ParamSync& sync, Step& step);
  // Waits for the queued work: it reads and writes the buffers destroyed after this.
  ~OverlapEngine();
  OverlapEngine(const OverlapEngine&) = delete;
  OverlapEngine& operator=(const OverlapEngine&) = delete;

  bool enabled() const { return config_.overlap != OverlapPolicy::off; }
  // After the parameters' device is adopted: Error(unsupported) where this device path cannot
  // overlap (CUDA parameters over several ranks of a host communicator).
  void check_device_path() const;
  bool per_bucket() const { return config_.overlap == OverlapPolicy::per_bucket; }
  bool round_open() const { return open_; }
  // per_bucket: reduce_gradients() updated the round's buckets; step() has not finished it.
  bool buckets_updated() const { return updated_in_round_; }
  // After the round's opening agreement (`agreed`: who contributes). `explicit_hand_over`:
  // opened by grad_ready/reduce_gradient, whose completion order is the one learned.
  void open_round(const comm::Agreed& agreed, bool explicit_hand_over);
  void hand(ParamId id, const TensorRef& grad);  // reduce_gradient
  void ready(ParamId id);                         // grad_ready
  void hand_zeros();                              // a rank in join(): zeros for every param not handed

  // reduce_gradients(): completes the buckets of params never handed (zeros at stage 2, the
  // gradients in place at stage 1) so every rank issues the same collectives (with the order
  // learned, every bucket is issued now), and returns the order to agree on and this rank's
  // failure, if any.
  struct RoundEnd {
    std::string order;
    std::optional<Error> failure;
  };
  RoundEnd close_hand_over();
  // After the ranks agreed on the order: learns it (first round), issues what is left (all of
  // it in the first round and while a rank is in join(), in position order then) and, unless
  // per_bucket, waits for every reduction.
  void settle_round();
  // After a failed agreement or a failed call: waits for the queued work and forgets the round.
  void abandon_round() noexcept;
  int num_buckets() const;
  int64_t staging_bytes() const;  // stage 2: the buckets assembled for reduction
  // The host waits for the bucket's queued work; on a device the compute stream (not the host)
  // waits for its gather, so that work enqueued on it afterwards reads the new values.
  void wait_bucket(int bucket);
  void wait_param(ParamId id);
  void wait_all();
  // The layout changed (no round open): waits for queued work, forgets buckets and order.
  void reset();

 private:
  struct Bucket {
    int64_t begin = 0;
    int64_t length = 0;
    int64_t trainable = 0;  // trainable elements in it
    int64_t missing = 0;    // of those, not handed yet
    int slot = -1;          // stage 2: staging buffer, -1 until first written
    bool issued = false;
  };

  const partition::Layout& layout() const { return shard_.layout(); }
  int64_t bucket_numel() const { return bucket_elements(config_, shard_.dtype()); }
  int64_t bucket_begin(int bucket) const { return static_cast<int64_t>(bucket) * bucket_numel(); }
  int64_t bucket_length(int bucket) const;
  // On a device the work runs here, now (it only enqueues); on the CPU, on the thread.
  bool runs_inline() const { return thread_ == nullptr || dev_.on_device(); }
  std::shared_ptr<comm::Ticket> submit(std::function<void()> work);
  // Stream-ordered device path: the per-bucket events exist for this layout.
  void ensure_events();
  void destroy_events() noexcept;
  static void* event_at(const std::vector<void*>& events, int index);
  bool gathers_per_bucket() const;
  void validate_hand(ParamId id, const char* call) const;
  void mark(std::size_t param);
  void copy_into_staging(std::size_t param, const void* grad);
  int acquire_staging();
  void reclaim_staging(bool wait_for_one);
  void try_issue();
  void issue(int bucket);
  void run_bucket(int bucket, const char* staged, void* staged_event, bool has_trainable, ReduceOp op);
  void complete_missing(bool zero_in_place);
  void gather_bucket(int bucket);
  void update_and_gather(const std::function<void(int64_t, int64_t)>& update);
  std::vector<int> forward_order() const;
  void wait_tickets(std::vector<std::shared_ptr<comm::Ticket>>& tickets);
  void end_round();
  // ---- on one node, through the node-shared gradient slots (overlap_slots.cpp) ----
  // The node's slots with their per-bucket counters, or null (the MPI path).
  const NodeGradSlots* slots() const;
  // This rank's part of the slots' counters: a new round (open_round), a bucket written into
  // this rank's slot (its reduction may start on every rank), its own piece summed on the
  // thread, and the wait for every rank's sums of every bucket.
  void count_slot_round();
  void hand_over_slot_bucket(int bucket);
  void run_bucket_on_slots(int bucket, uint64_t target);
  void wait_slots_reduced();
  uint64_t slot_target() const;

  std::shared_ptr<comm::CommThread> thread_;
  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  const ParamTable& table_;
  ShardState& shard_;
  ParamSync& sync_;
  Step& step_;

  // The round.
  bool open_ = false;
  bool explicit_ = false;
  bool deferred_ = false;  // a rank is in join(): issue at the end, in position order
  std::vector<Bucket> buckets_;
  std::vector<bool> handed_;
  std::vector<int> completed_;  // buckets in the order they completed on this rank
  std::size_t next_issue_ = 0;  // into learned_
  std::vector<std::shared_ptr<comm::Ticket>> reductions_;  // per bucket, this round's
  bool updated_in_round_ = false;  // per_bucket: the round's buckets were updated on the thread

  // Across rounds.
  std::vector<int> learned_;         // the agreed bucket order (empty until learned)
  uint64_t learned_layout_ = 0;      // the layout version it was learned for
  std::vector<std::shared_ptr<comm::Ticket>> gathers_;  // per bucket, the last step's
  std::vector<core::FlatBuffer> staging_;
  std::vector<bool> staging_busy_;
  core::FlatBuffer zeros_;  // stage 2: the gradient of a param never handed, kept until reset()
  // Reused by each bucket's collectives (only one thread runs them).
  std::vector<std::unique_ptr<PendingCollective>> pending_;
  std::vector<BroadcastPart> parts_;

  // Stream-ordered device path: per bucket, recorded on the communication stream behind its
  // reduction and behind its gather; per staging buffer, behind the reduction that read it.
  std::vector<void*> reduced_events_;
  std::vector<void*> gathered_events_;
  std::vector<void*> staging_events_;
  // The slots' rounds since the layout (and its zeroed counters) came: the counters' target.
  uint64_t slot_rounds_ = 0;
  uint64_t slot_layout_ = 0;
};

}  // namespace optim
}  // namespace shardopt
