// src/optim/overlap_work.cpp — the overlap engine's work per bucket, as it runs on the communication thread (CPU) or is enqueued on the streams (CUDA): the reduction and average, per_bucket's update and all-gather, and the step's gathers in forward order.
#include <algorithm>

#include "optim/overlap.hpp"

namespace shardopt {
namespace optim {

// On the communication thread, or on a device where the caller is: the bucket's reduction (the
// plain path's collectives and average), and with per_bucket its update and all-gather.
void OverlapEngine::run_bucket(int bucket, const char* staged, void* staged_event, bool has_trainable, ReduceOp op) {
  const DType dt = shard_.dtype();
  const int64_t begin = bucket_begin(bucket);
  const int64_t length = bucket_length(bucket);
  const partition::RankShard& own = shard_.own_shard();
  const int64_t own_lo = std::max(begin, own.offset);
  const int64_t own_hi = std::min(begin + length, own.offset + own.numel);
  void* reduced = event_at(reduced_events_, bucket);
  // The compute stream waits for the reduction only where it reads the result: here when it
  // divides the sum (Join) or updates the bucket (per_bucket); otherwise settle_round waits.
  const bool compute_reads = per_bucket() || dev_.gradient_average_divides();
  if (!shard_.stage2()) {
    if (dev_.world() > 1) {
      dev_.settle_before_collective();  // the gradients written on the compute stream
      pending_.push_back(dev_.comm().all_reduce_async(shard_.flat_grads().at(begin), length, dt, op));
      dev_.record_collectives(pending_, reduced);
      if (compute_reads) dev_.compute_waits(reduced);
      dev_.finish_gradient_average(shard_.flat_grads().at(begin), length, dt);
    }
  } else if (has_trainable) {
    dev_.settle_before_collective();  // the staging copies on the compute stream
    for (int r = 0; r < dev_.world(); ++r) {
      const partition::RankShard& shard = layout().shards[static_cast<std::size_t>(r)];
      const int64_t lo = std::max(begin, shard.offset);
      const int64_t hi = std::min(begin + length, shard.offset + shard.numel);
      if (lo >= hi) continue;
      void* into = r == dev_.rank() ? static_cast<void*>(shard_.shard_grads().at(lo - shard.offset)) : nullptr;
      if (dev_.world() == 1) {
        dev_.copy_bytes(into, element(staged, lo - begin, dt), span_bytes(hi - lo, dt));
      } else {
        pending_.push_back(dev_.comm().reduce_async(element(staged, lo - begin, dt), into, hi - lo, dt, op, r));
      }
    }
    dev_.record_collectives(pending_, reduced);
    if (staged_event != nullptr) dev_.record_collectives(pending_, staged_event);  // (none left: only the event)
    if (compute_reads) dev_.compute_waits(reduced);
    if (own_lo < own_hi) dev_.finish_gradient_average(shard_.shard_grads().at(own_lo - own.offset), own_hi - own_lo, dt);
  }
  if (!per_bucket()) return;
  if (own_lo < own_hi) step_.update_part(own_lo - own.offset, own_hi - own.offset);
  if (gathers_per_bucket()) gather_bucket(bucket);
}

// Every rank's piece of the bucket's positions, broadcast from its owner (one group).
void OverlapEngine::gather_bucket(int bucket) {
  const DType dt = shard_.dtype();
  const int64_t begin = bucket_begin(bucket);
  const int64_t length = bucket_length(bucket);
  parts_.clear();
  for (int r = 0; r < dev_.world(); ++r) {
    const partition::RankShard& shard = layout().shards[static_cast<std::size_t>(r)];
    const int64_t lo = std::max(begin, shard.offset);
    const int64_t hi = std::min(begin + length, shard.offset + shard.numel);
    if (lo < hi) parts_.push_back(BroadcastPart{shard_.flat_params().at(lo), hi - lo, r});
  }
  if (parts_.empty()) return;
  dev_.settle_before_collective();  // the update on the compute stream
  pending_.push_back(dev_.comm().broadcast_group_async(parts_.data(), parts_.size(), dt));
  dev_.record_collectives(pending_, event_at(gathered_events_, bucket));
}

std::vector<int> OverlapEngine::forward_order() const {
  std::vector<int> order = learned_;
  if (order.empty()) {
    for (int b = 0; b < num_buckets(); ++b) order.push_back(b);
  }
  std::reverse(order.begin(), order.end());
  return order;
}

// Step's update driver: the update (unless per_bucket did it on the thread), then the
// all-gathers in forward order, left in flight for wait_param.
void OverlapEngine::update_and_gather(const std::function<void(int64_t, int64_t)>& update) {
  if (updated_in_round_) {
    updated_in_round_ = false;
    std::vector<std::shared_ptr<comm::Ticket>> pending = reductions_;
    reductions_.clear();
    wait_tickets(pending);
    // On the slots: every rank's sums are in before the next round's backward writes a slot.
    if (slots() != nullptr) wait_slots_reduced();
    if (gathers_per_bucket()) return;  // each bucket was gathered after its update
  } else {
    update(0, shard_.own_shard().numel);
    if (gathers_per_bucket()) {
      gathers_.assign(static_cast<std::size_t>(num_buckets()), nullptr);
      for (int b : forward_order()) {
        gathers_[static_cast<std::size_t>(b)] = submit([this, b] { gather_bucket(b); });
      }
      return;
    }
  }
  // Node-shared parameters (a barrier per node) or replicated state: synced before returning.
  sync_.sync();
}

}  // namespace optim
}  // namespace shardopt
