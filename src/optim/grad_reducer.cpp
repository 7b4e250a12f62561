// src/optim/grad_reducer.cpp — gradient averaging: through node-shared slots on one node (stage 1 and 2), else a bucketed all-reduce (stage 1) or buckets reduced to their owners (stage 2).
//
// Stage 1 with bucket view, node-shared parameters and every rank on one node: the gradients
// are slots of one node-shared mapping (ShardState::node_grad_slots), so the average is a
// barrier, each rank summing its shard over the slots in memory, and a barrier (average_on_node)
// instead of MPI's copies through bounce buffers. Its summation order is the binomial tree of
// MPI's in-place all-reduce, so both paths give the same bits. With config.overlap the buckets
// still go through MPI (overlap.cpp), over the same slots. External storage on one node copies
// the caller's gradients into its slot first and the average back out. Across nodes with
// node-shared slots (nodes of equal size, no overlap: ShardState::map_grad_slots): each node's
// reduce-scatter through its slots, an all-reduce of each share among the nodes, the average
// written back into every slot (grad_reducer_hierarchy.cpp, which documents the sum order).
// Across nodes without slots (uneven nodes, config.overlap, no sharing): the MPI path.
//
// Stage 2 with node-shared slots (either storage): the gradients are in this rank's node-shared
// slot (bucket view: written there through grad_view() as at stage 1, or copied in by each
// hand-over; external storage: copied in). On one node the round's end is stage 1's barrier,
// sum and barrier with this rank's shard gradients as the only output: no MPI. Across nodes it
// is stage 1's hierarchical average, and the rank copies its shard out of its own slot.
//
// Stage 2 otherwise: the layout's positions [0, buffer_numel) are cut into buckets of bucket_elements.
// Each rank's shard is a contiguous range of positions, so a bucket meets each rank's shard in
// at most one contiguous piece: reducing the bucket is one rooted reduce per owner, straight
// into that owner's shard gradients. Together they move what one reduce-scatter would.
#include "optim/grad_reducer.hpp"

#include <algorithm>
#include <atomic>

#include "core/check.hpp"
#include "cpu/update_cpu.hpp"

namespace shardopt {
namespace optim {

uint64_t GradReducer::reduce_all() {
  const device::ScopedDevice scope(dev_.device());
  if (shard_.stage2()) {
    if (!shard_.bucket_view()) {
      SHARDOPT_CHECK(handed_count_ == 0, internal, "stage-2 round already open with external storage");
      const std::vector<ParamRecord>& params = table_.params();
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (params[i].trainable) hand_gradient(i, params[i].user_grad);
      }
    }
    return finish_round();
  }
  if (dev_.world() == 1) return 0;
  if (shard_.bucket_view()) {
    if (const NodeGradSlots* slots = shard_.node_grad_slots()) {
      average_on_node(*slots);
    } else {
      all_reduce_bucket_view();
    }
  } else if (const NodeGradSlots* slots = shard_.node_grad_slots()) {
    average_external_on_node(*slots);
  } else {
    all_reduce_external();
  }
  return 0;
}

void GradReducer::all_reduce_bucket_view() {
  dev_.settle_before_collective();
  // Two buckets in flight: the next one starts while the last finishes, and MPI's temporary
  // buffers stay at two buckets instead of a whole gradient's worth.
  // (On a stream-ordered communicator the device keeps that order and the host waits for none.)
  const core::FlatBuffer& grads = shard_.flat_grads();
  std::vector<std::unique_ptr<PendingCollective>> in_flight;
  const int64_t total = shard_.layout().buffer_numel;
  for (int64_t begin = 0; begin < total; begin += bucket_numel()) {
    const int64_t count = std::min(bucket_numel(), total - begin);
    dev_.bound_in_flight(in_flight, 1);
    in_flight.push_back(dev_.comm().all_reduce_async(grads.at(begin), count, shard_.dtype(), dev_.gradient_average_op()));
  }
  dev_.finish_collectives(in_flight);
  dev_.finish_gradient_average(grads.raw(), total, shard_.dtype());
}

// One node holds every rank's gradient slot: each rank averages its own shard over the slots, in
// the order of a binomial reduce to rank 0 (kernels/cpu: the fixed tree of average_slots_cpu),
// and writes the average back into every slot, so each rank's gradient views hold the whole
// average as after an all-reduce. Each slot element is read once and written once: 2N per
// element of the model on the node, against the floor of N + 1 (one shared result copy),
// which would need views that move after the reduction.
void GradReducer::average_on_node(const NodeGradSlots& slots) {
  const DType dt = shard_.dtype();
  average_into_every_slot(slots);
  dev_.finish_gradient_average(shard_.flat_grads().raw(), shard_.layout().buffer_numel, dt);
}

void GradReducer::average_into_every_slot(const NodeGradSlots& slots) {
  if (slots.cross) {
    average_across_nodes(slots);
    return;
  }
  const partition::RankShard& own = shard_.own_shard();
  std::vector<void*> outputs;
  for (char* slot : slots.slots) outputs.push_back(element(slot, own.offset, shard_.dtype()));
  sum_own_shard_over_slots(slots, outputs);
}

// This rank's shard of the slots, summed in the fixed tree order and divided, into `outputs`,
// between two node barriers.
void GradReducer::sum_own_shard_over_slots(const NodeGradSlots& slots, const std::vector<void*>& outputs) {
  const DType dt = shard_.dtype();
  const partition::RankShard& own = shard_.own_shard();
  std::vector<const void*> inputs;
  for (char* slot : slots.slots) inputs.push_back(element(slot, own.offset, dt));
  // The barriers order the ranks' plain stores into the slots (the backward's or the
  // hand-over's, then the averages); the fences keep the compiler from moving them across.
  // The second barrier also keeps a rank from writing its slot for the next round while
  // another still reads it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  slots.node->barrier();
  // As the MPI backend's avg: the sum divided by the world size (a Join round sums and divides
  // by the active ranks afterwards, in finish_gradient_average).
  const float divisor = dev_.gradient_average_op() == ReduceOp::avg ? static_cast<float>(dev_.world()) : 1.0f;
  kernels::average_slots_cpu(inputs.data(), static_cast<int>(inputs.size()), outputs.data(),
                             static_cast<int>(outputs.size()), dt, own.numel, divisor, config_.cpu_threads);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  slots.node->barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// External storage on one node: the caller's gradients are copied into this rank's slot, averaged
// as with bucket view (the average written into every slot), and copied back out of its own.
void GradReducer::average_external_on_node(const NodeGradSlots& slots) {
  const DType dt = shard_.dtype();
  const partition::Layout& layout = shard_.layout();
  const core::FlatBuffer& mine = shard_.hand_over_slot();
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].trainable && params[i].numel > 0) {
      dev_.copy_bytes(mine.at(layout.param_offset[i]), params[i].user_grad, span_bytes(params[i].numel, dt));
    }
  }
  average_into_every_slot(slots);
  dev_.finish_gradient_average(mine.raw(), layout.buffer_numel, dt);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].trainable && params[i].numel > 0) {
      dev_.copy_bytes(params[i].user_grad, mine.at(layout.param_offset[i]), span_bytes(params[i].numel, dt));
    }
  }
}

// External: packs trainable gradients into one staging bucket at a time, averages, unpacks.
void GradReducer::all_reduce_external() {
  const DType dt = shard_.dtype();
  const core::FlatBuffer& staging = shard_.grad_staging();
  struct Piece {
    char* grad;
    int64_t offset;
    int64_t length;
  };
  std::vector<Piece> pieces;
  int64_t filled = 0;
  auto flush = [&] {
    if (filled == 0) return;
    dev_.settle_before_collective();
    dev_.comm().all_reduce(staging.raw(), filled, dt, dev_.gradient_average_op());
    dev_.finish_gradient_average(staging.raw(), filled, dt);
    for (const Piece& piece : pieces) dev_.copy_bytes(piece.grad, staging.at(piece.offset), span_bytes(piece.length, dt));
    pieces.clear();
    filled = 0;
  };
  for (const ParamRecord& p : table_.params()) {
    if (!p.trainable) continue;
    for (int64_t done = 0; done < p.numel;) {
      const int64_t length = std::min(p.numel - done, staging.numel() - filled);
      char* source = element(p.user_grad, done, dt);
      dev_.copy_bytes(staging.at(filled), source, span_bytes(length, dt));
      pieces.push_back(Piece{source, filled, length});
      filled += length;
      done += length;
      if (filled == staging.numel()) flush();
    }
  }
  flush();
}

void GradReducer::open_round_if_needed() {
  if (round_open_) return;
  round_open_ = true;
  const partition::Layout& layout = shard_.layout();
  const int64_t total = layout.buffer_numel;
  for (int64_t begin = 0; begin < total; begin += bucket_numel()) {
    Bucket bucket;
    bucket.begin = begin;
    bucket.length = std::min(bucket_numel(), total - begin);
    buckets_.push_back(std::move(bucket));
  }
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].trainable) continue;
    const int64_t lo = layout.param_offset[i];
    const int64_t hi = lo + params[i].numel;
    for (int64_t pos = lo; pos < hi;) {
      Bucket& b = buckets_[static_cast<std::size_t>(pos / bucket_numel())];
      const int64_t end = std::min(hi, b.begin + b.length);
      b.missing += end - pos;
      pos = end;
    }
  }
  handed_.assign(params.size(), false);
}

int GradReducer::acquire_staging() {
  for (std::size_t i = 0; i < staging_busy_.size(); ++i) {
    if (!staging_busy_[i]) {
      staging_busy_[i] = true;
      return static_cast<int>(i);
    }
  }
  // A model smaller than one bucket needs no more staging than itself.
  staging_.push_back(dev_.new_buffer(std::min(bucket_numel(), shard_.layout().buffer_numel), shard_.dtype()));
  staging_busy_.push_back(true);
  return static_cast<int>(staging_.size()) - 1;
}

void GradReducer::wait_bucket(int index) {
  Bucket& b = buckets_[static_cast<std::size_t>(index)];
  // On a device the compute stream (which refills the staging slot next) waits for them.
  dev_.finish_collectives(b.pending);
  if (b.slot >= 0) staging_busy_[static_cast<std::size_t>(b.slot)] = false;
  b.slot = -1;
}

void GradReducer::finish_in_flight() {
  for (int index : in_flight_) wait_bucket(index);
  in_flight_.clear();
}

// All of a bucket's gradients are in: reduce each owner's piece to it.
void GradReducer::issue_bucket(int index) {
  Bucket& b = buckets_[static_cast<std::size_t>(index)];
  b.issued = true;
  if (in_flight_.size() >= kBucketsInFlight) {
    wait_bucket(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
  }
  dev_.settle_before_collective();
  const DType dt = shard_.dtype();
  const core::FlatBuffer& staged = staging_[static_cast<std::size_t>(b.slot)];
  const partition::Layout& layout = shard_.layout();
  for (int r = 0; r < dev_.world(); ++r) {
    const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(r)];
    const int64_t lo = std::max(b.begin, shard.offset);
    const int64_t hi = std::min(b.begin + b.length, shard.offset + shard.numel);
    if (lo >= hi) continue;
    void* into = r == dev_.rank() ? static_cast<void*>(shard_.shard_grads().at(lo - shard.offset)) : nullptr;
    if (dev_.world() == 1) {
      dev_.copy_bytes(into, staged.at(lo - b.begin), span_bytes(hi - lo, dt));
      continue;
    }
    b.pending.push_back(
        dev_.comm().reduce_async(staged.at(lo - b.begin), into, hi - lo, dt, dev_.gradient_average_op(), r));
  }
  in_flight_.push_back(index);
}

void GradReducer::hand_gradient(std::size_t i, const void* grad) {
  open_round_if_needed();
  const ParamRecord& p = table_.params()[i];
  const DType dt = shard_.dtype();
  const int64_t lo = shard_.layout().param_offset[i];
  // On one node: into this rank's slot, where the owners read it when the round finishes (a
  // gradient written through grad_view() is there already).
  const bool into_slot = shard_.node_grad_slots() != nullptr;
  char* in_slot = into_slot ? shard_.own_grad_slot().at(lo) : nullptr;
  if (into_slot && p.numel > 0 && in_slot != grad) dev_.copy_bytes(in_slot, grad, span_bytes(p.numel, dt));
  for (int64_t pos = lo; !into_slot && pos < lo + p.numel;) {
    const int index = static_cast<int>(pos / bucket_numel());
    Bucket& b = buckets_[static_cast<std::size_t>(index)];
    const int64_t end = std::min(lo + p.numel, b.begin + b.length);
    if (b.slot < 0) b.slot = acquire_staging();
    dev_.copy_bytes(staging_[static_cast<std::size_t>(b.slot)].at(pos - b.begin),
                    element(const_cast<void*>(grad), pos - lo, dt), span_bytes(end - pos, dt));
    b.missing -= end - pos;
    pos = end;
    if (b.missing == 0 && !deferred_) issue_bucket(index);
  }
  handed_[i] = true;
  ++handed_count_;
  handed_order_ = (handed_order_ ^ (static_cast<uint64_t>(i) + 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
}

void GradReducer::hand(ParamId id, const TensorRef& grad) {
  const device::ScopedDevice scope(dev_.device());
  SHARDOPT_CHECK(shard_.stage2(), invalid_argument,
                 "reduce_gradient() is for stage 2; at stage 1 write gradients into grad_view() and call "
                 "reduce_gradients()");
  SHARDOPT_CHECK(shard_.bucket_view(), invalid_argument,
                 "reduce_gradient(): with external storage, reduce_gradients() reads the registered gradient "
                 "buffers itself");
  const ParamRecord& p = table_.param(id);
  SHARDOPT_CHECK(p.trainable, invalid_argument, "reduce_gradient(): parameter '{}' is frozen", p.name);
  SHARDOPT_CHECK(grad.numel == p.numel && grad.dtype == p.dtype && grad.device == p.device, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has {} elements ({}, {}); the parameter has {} ({}, {})",
                 p.name, grad.numel, dtype_name(grad.dtype), device_name(grad.device), p.numel, dtype_name(p.dtype),
                 device_name(p.device));
  SHARDOPT_CHECK(grad.data != nullptr || p.numel == 0, invalid_argument,
                 "reduce_gradient(): the gradient of '{}' has no data", p.name);
  open_round_if_needed();
  SHARDOPT_CHECK(!handed_[static_cast<std::size_t>(id)], invalid_argument,
                 "reduce_gradient(): the gradient of '{}' was already handed in this round (call "
                 "reduce_gradients() to finish a round before the next)",
                 p.name);
  hand_gradient(static_cast<std::size_t>(id), grad.data);
  // No host wait: the copy out of the caller's buffer is on cuda_stream(), so whatever the
  // caller enqueues there next (reusing the buffer) runs after it.
}

void GradReducer::hand_zeros() {
  const device::ScopedDevice scope(dev_.device());
  const std::vector<ParamRecord>& params = table_.params();
  int64_t largest = 0;
  for (const ParamRecord& p : params) {
    if (p.trainable) largest = std::max(largest, p.numel);
  }
  // Allocated once per layout (reset() drops it): a joined rank hands zeros every step.
  if (zeros_.numel() < largest) zeros_ = dev_.new_buffer(largest, shard_.dtype());
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].trainable && !handed_[i]) hand_gradient(i, zeros_.raw());
  }
}

// Every bucket must be complete; then the round is finished.
uint64_t GradReducer::finish_round() {
  // Stage 2 with grad views and no hand-over this round: the gradients are read in place from
  // the slots, as at stage 1.
  const bool in_place = shard_.stage2_grad_views() && handed_count_ == 0;
  open_round_if_needed();
  const std::vector<ParamRecord>& params = table_.params();
  for (std::size_t i = 0; i < params.size() && !in_place; ++i) {
    SHARDOPT_CHECK(!params[i].trainable || handed_[i], invalid_argument,
                   "reduce_gradients(): rank {} never handed the gradient of '{}' with reduce_gradient() in this "
                   "round (every trainable parameter must be handed, on every rank, in the same order)",
                   dev_.rank(), params[i].name);
  }
  if (const NodeGradSlots* slots = shard_.node_grad_slots()) {
    if (slots->cross) {
      // Across nodes: stage 1's average in every slot, then this rank's shard out of its own.
      average_into_every_slot(*slots);
      const partition::RankShard& own = shard_.own_shard();
      dev_.copy_bytes(shard_.shard_grads().raw(), shard_.own_grad_slot().at(own.offset), span_bytes(own.numel, shard_.dtype()));
    } else {
      // Every rank's slot is complete after the first barrier: sum this rank's shard over them
      // straight into its shard gradients (the order is stage 1's, so both stages agree).
      sum_own_shard_over_slots(*slots, {shard_.shard_grads().raw()});
    }
  }
  for (std::size_t index = 0; index < buckets_.size(); ++index) {
    // Deferred buckets start here, in bucket order (those without a trainable element never do).
    const Bucket& b = buckets_[index];
    if (!b.issued && b.slot >= 0) issue_bucket(static_cast<int>(index));
  }
  finish_in_flight();
  dev_.finish_gradient_average(shard_.shard_grads().raw(), shard_.shard_grads().numel(), shard_.dtype());
  const uint64_t order = handed_order_;
  end_round();
  return order;
}

void GradReducer::end_round() {
  finish_in_flight();
  round_open_ = false;
  buckets_.clear();
  handed_.assign(table_.size(), false);
  handed_count_ = 0;
  handed_order_ = 0;
}

void GradReducer::reset() {
  end_round();
  staging_.clear();
  staging_busy_.clear();
  zeros_ = core::FlatBuffer();
}

int64_t GradReducer::staging_bytes() const {
  int64_t bytes = 0;
  for (const core::FlatBuffer& b : staging_) bytes += b.bytes();
  return bytes;
}

}  // namespace optim
}  // namespace shardopt
