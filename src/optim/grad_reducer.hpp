// src/optim/grad_reducer.hpp — averaging gradients over the ranks: in the nodes' shared gradient slots (stage 1 and 2; across nodes hierarchically), else a bucketed all-reduce (stage 1) or buckets reduced to their owners as they complete (stage 2).
#pragma once

#include <memory>
#include <vector>

#include "optim/shard_state.hpp"

namespace shardopt {
namespace optim {

class GradReducer {
 public:
  GradReducer(const DeviceContext& dev, const OptimizerConfig& config, const ParamTable& table,
              const ShardState& shard)
      : dev_(dev), config_(config), table_(table), shard_(shard) {}

  // Collective: the whole reduction (stage 1), or the end of a stage-2 round (external storage
  // hands every registered gradient first). Returns a hash of this round's hand-over order
  // (stage 2; 0 otherwise), which the caller has the ranks agree on.
  uint64_t reduce_all();
  // Stage 2, bucket view: copies param `id`'s local gradient into its buckets, reducing each
  // bucket it completes. Checks the argument first.
  void hand(ParamId id, const TensorRef& grad);
  // Forgets buckets, hand-overs and staging (for a layout change, which needs no open round).
  void reset();
  int64_t staging_bytes() const;
  // Stage 2 while a peer is in join(): buckets are reduced when the round finishes, in bucket
  // order, instead of as hand-overs complete them, so a joined rank (which hands zeros in its
  // own order) issues the same collectives in the same order. Set at the start of a round.
  void set_deferred(bool deferred) { deferred_ = deferred; }
  // Whether a stage-2 round has had a hand-over (reduce_gradients() has not finished it yet).
  bool round_started() const { return handed_count_ > 0; }
  // A rank in join(): hands a zero gradient for every trainable param, in registration order.
  void hand_zeros();

 private:
  struct Bucket {
    int64_t begin = 0;    // global position (layout order) of its first element
    int64_t length = 0;
    int64_t missing = 0;  // trainable elements not handed yet
    int slot = -1;        // staging buffer in use, -1 until the first hand-over
    bool issued = false;  // its reduces were started
    std::vector<std::unique_ptr<PendingCollective>> pending;  // its reduces, once issued
  };
  static constexpr std::size_t kBucketsInFlight = 2;

  void all_reduce_bucket_view();
  void average_on_node(const NodeGradSlots& slots);
  void average_external_on_node(const NodeGradSlots& slots);
  void sum_own_shard_over_slots(const NodeGradSlots& slots, const std::vector<void*>& outputs);
  // The whole average into every slot of every node: sum_own_shard_over_slots on one node, the
  // hierarchical reduction (grad_reducer_hierarchy.cpp) across nodes.
  void average_into_every_slot(const NodeGradSlots& slots);
  void average_across_nodes(const NodeGradSlots& slots);
  void all_reduce_external();
  void open_round_if_needed();
  int acquire_staging();
  void wait_bucket(int index);
  void finish_in_flight();
  void issue_bucket(int index);
  void hand_gradient(std::size_t i, const void* grad);
  uint64_t finish_round();
  void end_round();
  int64_t bucket_numel() const { return bucket_elements(config_, shard_.dtype()); }

  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  const ParamTable& table_;
  const ShardState& shard_;

  bool round_open_ = false;
  std::vector<Bucket> buckets_;
  std::vector<core::FlatBuffer> staging_;  // a pool: at most kBucketsInFlight + open ones
  std::vector<bool> staging_busy_;
  core::FlatBuffer zeros_;  // hand_zeros' source, kept until the layout changes
  std::vector<int> in_flight_;  // issued, not yet waited for, oldest first
  std::vector<bool> handed_;    // per param, this round
  int64_t handed_count_ = 0;
  uint64_t handed_order_ = 0;
  bool deferred_ = false;
};

}  // namespace optim
}  // namespace shardopt
