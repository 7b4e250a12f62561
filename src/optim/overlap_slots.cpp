// src/optim/overlap_slots.cpp — the overlap engine on one node: buckets handed over through counters in the node-shared gradient slots and summed on the communication thread as soon as every rank of the node has handed them, no collective.
//
// Each bucket has two counters in the slots' mapping that only grow (NodeGradSlots): `handed`
// gets one count from each rank once the bucket is complete in its slot, `reduced` one from each
// rank once it has summed its own piece of the bucket over the slots. In round k (counted from 1
// per layout, alike on every rank since every rank opens every round) a rank's thread sums its
// piece once `handed` reaches k x node size, and the round ends (settle_round, or the step under
// per_bucket) once every bucket's `reduced` has: then every average is written (stage 1: into
// every slot) and no rank reads a slot any more, so the next round's backward may write them.
// The plain path's two barriers become these waits, per bucket.
//
// The waits poll (a short spin that yields, then sleeps of up to 1 ms: comm/watchdog.hpp) and
// give up after the communicator's timeout with Error(timeout) naming the bucket and how many
// ranks had arrived: a peer that failed or never hands its gradients does not hang the node.
#include <algorithm>

#include "comm/watchdog.hpp"
#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
#include "optim/overlap.hpp"

namespace shardopt {
namespace optim {
namespace {

uint64_t load_acquire(const uint64_t* counter) { return __atomic_load_n(counter, __ATOMIC_ACQUIRE); }
void add_release(uint64_t* counter) { __atomic_fetch_add(counter, uint64_t{1}, __ATOMIC_RELEASE); }

}  // namespace

const NodeGradSlots* OverlapEngine::slots() const {
  const NodeGradSlots* s = shard_.node_grad_slots();
  return enabled() && s != nullptr && s->handed != nullptr && !dev_.on_device() ? s : nullptr;
}

uint64_t OverlapEngine::slot_target() const {
  return slot_rounds_ * static_cast<uint64_t>(slots()->node->size());
}

void OverlapEngine::count_slot_round() {
  // A new layout maps new slots with zeroed counters.
  if (slot_layout_ != shard_.layout_version()) {
    slot_layout_ = shard_.layout_version();
    slot_rounds_ = 0;
  }
  ++slot_rounds_;
}

// The bucket is complete in this rank's slot (its plain stores made before this release).
void OverlapEngine::hand_over_slot_bucket(int bucket) {
  add_release(&slots()->handed[bucket]);
  issue(bucket);
}

// On the communication thread: once every rank has handed the bucket over, this rank's piece of
// it summed over the slots in the plain reduction's order and divided (stage 1: into every
// slot; stage 2: into this rank's shard gradients), then counted as reduced.
void OverlapEngine::run_bucket_on_slots(int bucket, uint64_t target) {
  const NodeGradSlots& s = *slots();
  const comm::Deadline deadline(dev_.comm().timeout_seconds());
  const bool all_handed = comm::poll_until(deadline, [&] { return load_acquire(&s.handed[bucket]) >= target; });
  if (!all_handed) {
    const uint64_t arrived = load_acquire(&s.handed[bucket]) + static_cast<uint64_t>(s.node->size()) - target;
    raise(ErrorCode::timeout,
          "reduce_gradients: bucket {} was handed over by {} of the node's {} ranks within {} s (rank {} waited for "
          "the others to write it into their node-shared gradient slots; a peer failed, or it hands its gradients "
          "in another round)",
          bucket, arrived, s.node->size(), deadline.seconds(), dev_.rank());
  }
  const DType dt = shard_.dtype();
  const int64_t begin = bucket_begin(bucket);
  const partition::RankShard& own = shard_.own_shard();
  const int64_t lo = std::max(begin, own.offset);
  const int64_t hi = std::min(begin + bucket_length(bucket), own.offset + own.numel);
  if (lo < hi) {
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    for (char* slot : s.slots) inputs.push_back(element(slot, lo, dt));
    if (shard_.stage2()) {
      outputs.push_back(shard_.shard_grads().at(lo - own.offset));
    } else {
      for (char* slot : s.slots) outputs.push_back(element(slot, lo, dt));
    }
    // The divisor straight away (the world size, or under Join the ranks that contributed):
    // bitwise the plain path's sum and later division, since the sum is rounded to the dtype
    // before it is divided either way.
    kernels::average_slots_cpu(inputs.data(), static_cast<int>(inputs.size()), outputs.data(),
                               static_cast<int>(outputs.size()), dt, hi - lo,
                               static_cast<float>(dev_.gradient_divisor()), config_.cpu_threads);
  }
  add_release(&s.reduced[bucket]);
  if (per_bucket() && lo < hi) step_.update_part(lo - own.offset, hi - own.offset);
}

// Every rank has summed its piece of every bucket: the averages are complete, and no rank reads
// this rank's slot any more.
void OverlapEngine::wait_slots_reduced() {
  const NodeGradSlots& s = *slots();
  const uint64_t target = slot_target();
  const comm::Deadline deadline(dev_.comm().timeout_seconds());
  for (int b = 0; b < num_buckets(); ++b) {
    const bool done = comm::poll_until(deadline, [&] { return load_acquire(&s.reduced[b]) >= target; });
    SHARDOPT_CHECK(done, timeout,
                   "reduce_gradients: bucket {} was summed by {} of the node's {} ranks within {} s (rank {} waited "
                   "for their sums in the node-shared gradient slots; a peer failed)",
                   b, load_acquire(&s.reduced[b]) + static_cast<uint64_t>(s.node->size()) - target, s.node->size(),
                   deadline.seconds(), dev_.rank());
  }
}

}  // namespace optim
}  // namespace shardopt
