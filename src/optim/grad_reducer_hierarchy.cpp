// src/optim/grad_reducer_hierarchy.cpp — the gradient average across nodes with node-shared slots: each node's share summed over its slots, all-reduced among the nodes, written back into every slot.
//
// Nodes of L ranks each (K nodes, N = K x L ranks), every rank's gradients in its node's slots:
//  (a) a node barrier; node rank c sums share c of the buffer over the node's L slots (the
//      fixed tree of average_slots_cpu, in node-rank order) into its own slot;
//  (b) it all-reduces (sum) that share with carrier group c: the ranks of place c on the other
//      nodes, which summed the same share of their nodes; bucket by bucket, two in flight;
//  (c) it divides the node-wide sum by the world size (as the one-node path does) and writes
//      it into share c of every slot of its node; a node barrier. Every slot then holds the
//      whole average: stage 1 reads it through its gradient views, stage 2 copies its own
//      shard out of its own slot.
//
// The shares split [0, buffer_numel) evenly (in whole cache lines), independently of the
// optimizer's shards: a node has L shares but N shards, so shares that coincide with shards
// would be K shards each, as uneven as the partition (sorted_greedy, Muon's whole matrices),
// while the even split gives every rank the same summing and the same cross-node traffic. The
// price at stage 2 is a copy of the rank's shard out of its slot (1/N of the model).
//
// Summation order: the sum over a node's ranks in average_slots_cpu's tree, then MPI's sum of
// the K node sums, then one division. With L a power of two and K = 2 this is exactly the tree
// the one-node path (and MPI's all-reduce of N ranks) uses when the nodes hold consecutive
// ranks: the tree of N splits at the node boundary and a sum of two is commutative, so the
// result is bitwise that of N ranks on one node (tests/multihost reduce_2x2 checks 2 x 2).
// Otherwise (more nodes, nodes of other sizes, or ranks spread over the nodes round-robin) the
// order differs, and so may the bits: the difference from the one-node average is that of two
// sum orders of the same N terms, each pairwise sum rounded to the dtype on either path, at
// most (N - 1) x eps x sum|g| / N per element plus the division's rounding (eps the dtype's:
// 2^-23 for f32, 2^-7 for bf16, 2^-10 for f16). That bound is documented, not tested here.
#include <algorithm>
#include <atomic>

#include "cpu/update_cpu.hpp"
#include "optim/grad_reducer.hpp"

namespace shardopt {
namespace optim {

void GradReducer::average_across_nodes(const NodeGradSlots& slots) {
  const DType dt = shard_.dtype();
  Communicator& node = *slots.node;
  const int places = node.size();
  const int place = node.rank();
  const int64_t total = shard_.layout().buffer_numel;
  // Share c: [c x per, (c+1) x per) clipped to the buffer, per a whole number of cache lines.
  const int64_t lines = (total + kShardAlignment - 1) / kShardAlignment;
  const int64_t per = (lines + places - 1) / places * kShardAlignment;
  const int64_t begin = std::min(total, per * place);
  const int64_t count = std::min(total, begin + per) - begin;
  char* own = slots.slots[static_cast<std::size_t>(place)];

  // (a) The barrier orders the ranks' plain stores into the slots (the backward's or the
  // hand-over's); the fences keep the compiler from moving them across.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  node.barrier();
  std::vector<const void*> inputs;
  for (char* slot : slots.slots) inputs.push_back(element(slot, begin, dt));
  void* node_sum = element(own, begin, dt);
  kernels::average_slots_cpu(inputs.data(), places, &node_sum, 1, dt, count, 1.0f, config_.cpu_threads);

  // (b) The node sums of this share, summed over the nodes in place.
  dev_.settle_before_collective();
  std::vector<std::unique_ptr<PendingCollective>> in_flight;
  for (int64_t done = 0; done < count; done += bucket_numel()) {
    dev_.bound_in_flight(in_flight, 1);
    in_flight.push_back(slots.cross->all_reduce_async(element(own, begin + done, dt),
                                                      std::min(bucket_numel(), count - done), dt, ReduceOp::sum));
  }
  dev_.finish_collectives(in_flight);

  // (c) As the MPI backend's avg: divided by the world size (a Join round sums and divides by
  // the active ranks afterwards, in finish_gradient_average).
  const float divisor = dev_.gradient_average_op() == ReduceOp::avg ? static_cast<float>(dev_.world()) : 1.0f;
  const void* summed = node_sum;
  std::vector<void*> outputs;
  for (char* slot : slots.slots) outputs.push_back(element(slot, begin, dt));
  kernels::average_slots_cpu(&summed, 1, outputs.data(), places, dt, count, divisor, config_.cpu_threads);
  // The average is in every slot before any rank reads it, and no rank writes its slot for the
  // next round while another still reads it.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  node.barrier();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace optim
}  // namespace shardopt
