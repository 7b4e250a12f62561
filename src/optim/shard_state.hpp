// src/optim/shard_state.hpp — this rank's shard: the layout, the flat parameter/gradient buffers, the optimizer state and fp32 masters, and their migration when the layout changes.
//
// The checkpoint module reads and installs state only through the declared interface below
// (state(), param values as f32, install_state()), which keeps the update runs and masters
// consistent itself.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/node_topology.hpp"
#include "core/flat_buffer.hpp"
#include "optim/device_context.hpp"
#include "optim/param_table.hpp"
#include "optim/state_kinds.hpp"
#include "partition/partition.hpp"
#include "q8_state.hpp"

namespace shardopt {
namespace optim {

// Flat shards start on 16-element (64-byte) boundaries: whole cache lines per rank, and
// 16-byte vector access on devices.
constexpr int64_t kShardAlignment = 16;

// A stretch of this rank's shard that one kernel call updates: consecutive elements of
// params in one group with the same step history.
struct UpdateRun {
  int32_t first_param = 0;  // its step count and group stand for the whole run
  int64_t shard_offset = 0;
  int64_t length = 0;
  char* param = nullptr;
  char* grad = nullptr;
  int64_t first_index = 0;  // ParamRecord::first_index of the first element: stochastic rounding's key
  // Where the run's state is (ShardState::place_moments): f32 kind k at state_offset[k] of its
  // buffer (-1: the run keeps none of kind k; the master at the shard offset); 8-bit moments (q8,
  // one parameter's whole segment) at code_offset, their absmax at block_offset.
  std::array<int64_t, kStateKinds> state_offset{};
  bool q8 = false;
  int64_t code_offset = 0;
  int64_t block_offset = 0;
};

using StateMask = std::array<bool, kStateKinds>;

// Where one segment of this rank's shard keeps its state. Each f32 moment kind (exp_avg,
// exp_avg_sq, max_exp_avg_sq, momentum_buffer) is kept only over the segments of params whose
// algorithm has it and that keep no 8-bit moments, packed in segment order: a Muon matrix holds
// momentum_buffer only, an AdamW vector exp_avg and exp_avg_sq only (kind_belongs), so a mixed
// optimizer keeps 4 and 8 bytes per element, not 12. Codes and absmax are packed alike over the
// 8-bit segments. A kind that every segment of a shard without 8-bit params holds spans the
// whole shard instead (offset = shard offset, padding included): the layout of every
// single-algorithm optimizer, and of shard formats 1 and 2.
struct MomentPlace {
  std::array<int64_t, kStateKinds> offset{};  // in kind k's buffer; -1: none of kind k here. kMaster: the shard offset
  bool q8 = false;
  int64_t code_offset = 0;
  int64_t block_offset = 0;
};

struct MomentLayout {
  std::vector<MomentPlace> places;  // per segment of the shard, in order
  std::array<int64_t, kStateKinds> numel{};  // elements of each kind's buffer (kMaster: the shard's)
  int64_t code_numel = 0;
  int64_t blocks = 0;
};

// The moments' placement over `shard` when q8_param[i] says whether param i keeps 8-bit
// moments and holds[i] which f32 kinds param i's algorithm keeps (algorithm_kinds; empty: every
// param every kind, the placement of shard formats 1 and 2). shard_state's own layout, and the
// layout of a checkpoint's shard file.
MomentLayout place_moments(const partition::RankShard& shard, const std::vector<bool>& q8_param,
                           const std::vector<StateMask>& holds = {});

// 8-bit moments over a shard, exp_avg then exp_avg_sq: codes (bytes) and absmax per block,
// packed as MomentLayout places them.
struct Q8Buffers {
  std::array<core::FlatBuffer, 2> codes;
  std::array<core::FlatBuffer, 2> absmax;
};

using StateBuffers = std::array<core::FlatBuffer, kStateKinds>;

// Byte offset of element `index` of a `dtype` buffer.
inline char* element(void* base, int64_t index, DType dtype) {
  return static_cast<char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}
inline const char* element(const void* base, int64_t index, DType dtype) {
  return static_cast<const char*>(base) + index * static_cast<int64_t>(dtype_size(dtype));
}
inline std::size_t span_bytes(int64_t count, DType dtype) {
  return static_cast<std::size_t>(count) * dtype_size(dtype);
}

partition::Strategy strategy_of(const OptimizerConfig& config);

// Node-shared parameters: every rank's gradients in one node-shared mapping per node, a slot
// per rank, so the reduction sums each shard over the slots in memory (grad_reducer.cpp) instead
// of through MPI. Bucket view (stage 1, and stage 2 without overlap): a rank's flat_grads() is
// its slot. External storage: each gradient is copied into the rank's slot (hand_over_slot())
// first. Across nodes (nodes of equal size, config.overlap off) the node's sums are then
// all-reduced in the cross-node carrier groups (grad_reducer_hierarchy.cpp).
struct NodeGradSlots {
  std::shared_ptr<Communicator> node;   // the node's ranks (the world when there is one node)
  std::shared_ptr<Communicator> cross;  // this rank's carrier group across nodes; null on one node
  std::vector<char*> slots;            // by node rank: buffer_numel (+ frozen elements, bucket view)
  // config.overlap: per overlap bucket, in the same mapping, counters that only grow (atomics,
  // never reset while the layout lasts): `handed` counts the node's ranks that have written the
  // bucket into their slot, `reduced` those that have summed their piece of it; after round k
  // (from 1) both reach k x node size. Null without overlap.
  uint64_t* handed = nullptr;
  uint64_t* reduced = nullptr;
  int64_t buckets = 0;
};

// Elements in one collective of the gradient reduction, the parameter sync and the state
// migration (config.bucket_bytes), never more than a collective's count limit (INT_MAX).
inline int64_t bucket_elements(const OptimizerConfig& config, DType dtype) {
  constexpr int64_t kLargest = (int64_t{INT32_MAX} / kShardAlignment) * kShardAlignment;
  const int64_t wanted = config.bucket_bytes / static_cast<int64_t>(dtype_size(dtype));
  return std::min(kLargest, std::max<int64_t>(kShardAlignment, wanted));
}

// The most buckets a layout's buffer is cut into (bucket_elements each): every bucket is a
// collective of each step and a record of each round, and bucket indices travel as int
// (num_buckets(), the C ABI's int32). Registration refuses more (check_bucket_count).
constexpr int64_t kMaxBuckets = int64_t{1} << 24;

class ShardState {
 public:
  ShardState(const DeviceContext& dev, const OptimizerConfig& config, const ParamTable& table)
      : dev_(dev), config_(config), table_(table) {}

  // Collective when sharded and state exists (each old shard is broadcast once per state kind).
  // Builds the layout for the table's params and trainable flags, carrying state and (bucket
  // view) values over; params from `first_new` on take `initial` values (null: zeros).
  void rebuild(const std::vector<const void*>& initial = {}, std::size_t first_new = 0);
  // Allocates (zeroed, as torch's lazily created state) kinds that hyperparameters now need.
  void ensure_state_kinds();
  StateMask state_kinds_needed() const;
  // Update runs merge params with equal step histories: call after step counts change.
  void refresh_runs();

  const partition::Layout& layout() const { return layout_; }
  const partition::RankShard& own_shard() const { return layout_.shards[static_cast<std::size_t>(dev_.rank())]; }
  uint64_t layout_version() const { return layout_version_; }
  // Bumps whenever the shard's values or state are replaced from outside the update: a layout
  // change, or a checkpoint or state dict installed (install_state). Parameters written through
  // views are not seen here.
  uint64_t values_generation() const { return values_generation_; }
  bool sharded() const { return config_.shard_state && dev_.world() > 1; }
  bool stage2() const { return config_.stage == 2; }
  bool bucket_view() const { return config_.storage == Storage::bucket_view; }
  DType dtype() const { return table_.dtype(); }
  const std::vector<UpdateRun>& runs() const { return runs_; }

  // Where param i's values and gradient live (null gradient in stage-2 bucket view).
  void* param_ptr(std::size_t i) const;
  void* grad_ptr(std::size_t i) const;
  const core::FlatBuffer& flat_params() const { return flat_params_; }
  // The nodes whose ranks share the parameters' buffer (config.node_shared_params, where it
  // applies and the memory could be mapped on every node): flat_params() with bucket view,
  // sync_staging() with external storage. Null when each rank has its own.
  const comm::NodeTopology* node_sharing() const { return shared_buffer().borrowed() ? nodes_.get() : nullptr; }
  const core::FlatBuffer& shared_buffer() const { return bucket_view() ? flat_params_ : sync_staging_; }
  // Why the parameters are not node-shared although config asked (empty when they are, or when
  // sharing does not apply).
  const std::string& node_sharing_refused() const { return node_sharing_refused_; }
  const core::FlatBuffer& flat_grads() const { return flat_grads_; }
  // The node's gradient slots where they exist (see NodeGradSlots), else null.
  const NodeGradSlots* node_grad_slots() const { return grad_slots_.slots.empty() ? nullptr : &grad_slots_; }
  const core::FlatBuffer& sync_staging() const { return sync_staging_; }
  const core::FlatBuffer& grad_staging() const { return grad_staging_; }
  const core::FlatBuffer& shard_grads() const { return shard_grads_; }
  // External storage on one node with node-shared parameters: this rank's gradient slot (layout
  // positions [0, buffer_numel)); empty otherwise.
  const core::FlatBuffer& hand_over_slot() const { return hand_over_slot_; }
  // Stage 2 with bucket view on one node: the rank's node-shared slot is its gradient buffer
  // (flat_grads(), grad_view()), as at stage 1; the hand-over writes into it (with or without
  // config.overlap).
  bool stage2_grad_views() const { return stage2() && bucket_view() && flat_grads_.numel() > 0; }
  // Where this rank's gradients are summed from on one node (see NodeGradSlots).
  const core::FlatBuffer& own_grad_slot() const { return bucket_view() ? flat_grads_ : hand_over_slot_; }
  const StateBuffers& state() const { return state_; }
  float* state_data(std::size_t kind) const { return state_[kind].data(); }
  // remainder16 groups: the 16-bit master remainders over this rank's shard (2 bytes per shard
  // element; empty when no group keeps them). Elements of other groups are unused.
  const core::FlatBuffer& remainder_buffer() const { return remainders_; }
  int16_t* master_remainders() const { return static_cast<int16_t*>(remainders_.raw()); }
  // The moments' placement over a shard of the current table (see MomentPlace).
  MomentLayout place_moments(const partition::RankShard& shard) const;
  // Elements of kind k's buffer over this rank's shard (the master: the shard's).
  int64_t state_numel(std::size_t k) const { return state_numel_[k]; }
  // 8-bit moments of a q8 run (codes and absmax; kernels/q8_state.hpp).
  kernels::Q8Moments q8_moments(const UpdateRun& run) const;
  int64_t q8_bytes() const;
  // The 8-bit moments over this rank's shard (m = 0: exp_avg, 1: exp_avg_sq).
  const core::FlatBuffer& q8_codes(std::size_t m) const { return q8_codes_[m]; }
  const core::FlatBuffer& q8_absmax(std::size_t m) const { return q8_absmax_[m]; }
  bool remainder_master(const ParamRecord& p) const {
    return table_.storage(p.group).master == MasterStorage::remainder16 && dtype() == DType::bf16;
  }

  // ---- for checkpoints ----
  // Elements [offset, offset+n) of param i as f32 (bf16/f16 widened into `scratch`, exactly);
  // host state only.
  const float* param_values_f32(std::size_t i, int64_t offset, int64_t n, std::vector<float>& scratch) const;
  // Sets elements [offset, offset+n) of param i from f32 `values` in the optimizer's memory
  // (device memory, enqueued on its stream, when it is on a device; else host memory).
  // With node-shared parameters a frozen param's values are written by the node's first rank
  // only (every rank passes the same values; the next sync makes them visible to all).
  void set_param_values_f32(std::size_t i, int64_t offset, int64_t n, const float* values);
  // Replaces the state over this rank's shard (kinds not in `kinds` are dropped): each kind as
  // place_moments(own_shard()) places it (state_numel(k) elements), and the 8-bit moments (`q8`, empty buffers without
  // 8-bit params). For bf16/f16 params, a master absent from `kinds` (or listed in
  // `without_master`) is seeded from the current parameter values, as a fresh optimizer's would be.
  void install_state(const StateMask& kinds, StateBuffers buffers, const std::vector<bool>& without_master,
                     Q8Buffers q8 = {});
  // Checkpoints and state dicts carry fp32 masters whatever the storage: this fills the
  // "master" kind (allocated over the shard where only remainders are kept) with the masters
  // rebuilt from the parameters and remainders, bitwise. The copy lives until the next update
  // (ensure_state_kinds), so a background save may read it meanwhile. Host only.
  void materialise_masters();

 private:
  // Per param of the table: whether it keeps 8-bit moments now.
  std::vector<bool> q8_flags() const;
  // place_moments() over `shard` with these 8-bit flags (params past their end: none).
  MomentLayout place_moments_flagged(const partition::RankShard& shard, std::vector<bool> q8_param) const;
  // What a layout change moves state between: the old layout with every old shard's placement
  // (under the 8-bit flags it was laid out with: set_trainable changes a param's flag before the
  // new layout exists), and this rank's new shard with its placement.
  struct LayoutChange {
    const partition::Layout& from;
    std::vector<MomentLayout> from_places;  // by old rank
    const partition::RankShard& own;
    const MomentLayout& own_places;
  };
  void migrate_state(const LayoutChange& change, StateBuffers& next) const;
  // The 8-bit moments of this rank's old shard moved into `next` (placed as change.own_places
  // places them): each 8-bit param's codes and absmax whole, from the rank that held it
  // (collective when sharded). Params new to 8-bit moments keep next's zeros.
  void migrate_q8(const LayoutChange& change, Q8Buffers& next) const;
  void seed_masters(const std::vector<bool>& params_to_seed);
  // remainder16 params: the installed fp32 master split into parameter and remainder.
  void split_masters(const std::vector<bool>& params_to_seed);
  // A buffer of this rank's old shard moved into `next` over the new layout (collective when
  // sharded: each old shard is broadcast once), placed as state kind `kind` is (kMaster: by
  // shard offset, as the remainders are too).
  void migrate_buffer(const LayoutChange& change, const core::FlatBuffer& old, core::FlatBuffer& next, DType dtype,
                      std::size_t kind) const;
  // Collective: the bucket-view parameter buffer (or the external storage's sync staging) for
  // `numel` elements, node-shared where it applies (decided alike on every rank), else this
  // rank's own.
  core::FlatBuffer new_param_buffer(int64_t numel);
  // Collective over the node when `params_shared`: the bucket-view gradient buffer, a slot of
  // the node's shared mapping (filling `slots`) where every rank is on one node and the memory
  // could be mapped, else this rank's own.
  core::FlatBuffer new_grad_buffer(int64_t numel, bool params_shared, NodeGradSlots& slots, int64_t buckets);
  // Collective over the node when `params_shared`: this rank's slot of a node-shared mapping of
  // a slot per rank (filling `slots`) where every rank is on one node and the memory could be
  // mapped; an empty buffer otherwise (decided alike on every rank). `buckets`: the counter
// pairs of config.overlap's buckets mapped after the slots (0: none).
  core::FlatBuffer map_grad_slots(int64_t numel, bool params_shared, NodeGradSlots& slots, int64_t buckets);
  // Fills the new bucket-view parameter buffer from the old one or the initial values. With a
  // node-shared buffer each element is written once per node: by its owner when the owner is on
  // this node, else by the node's first rank (rebuild() ends with the node's barrier).
  void fill_params(core::FlatBuffer& next_params, const partition::Layout& next, const std::vector<int64_t>& next_offset,
                   const std::vector<const void*>& initial, std::size_t first_new) const;

  const DeviceContext& dev_;
  const OptimizerConfig& config_;
  const ParamTable& table_;

  partition::Layout layout_;
  bool has_layout_ = false;
  uint64_t layout_version_ = 0;
  uint64_t values_generation_ = 0;
  StateBuffers state_;          // f32, over this rank's shard
  StateMask state_in_use_{};    // the same on every rank, even where a shard is empty
  core::FlatBuffer remainders_;  // int16 (held as 2-byte bf16 storage) over this rank's shard
  std::array<int64_t, kStateKinds> state_numel_{};  // elements of each f32 kind over the shard
  std::array<core::FlatBuffer, 2> q8_codes_;      // exp_avg, exp_avg_sq: bytes over the 8-bit params
  std::array<core::FlatBuffer, 2> q8_absmax_;     // their absmax per block
  std::vector<bool> q8_laid_out_;       // per param: 8-bit moments in the current layout
  bool remainders_in_use_ = false;     // the same on every rank, even where a shard is empty
  bool masters_materialised_ = false;  // state_[kMaster] is materialise_masters()'s copy
  core::FlatBuffer flat_params_;   // bucket view: trainable shards then frozen params
  core::FlatBuffer flat_grads_;    // bucket view, stage 1 (stage 2 on one node): as flat_params_
  NodeGradSlots grad_slots_;       // where flat_grads_ is this rank's slot of the node's
  core::FlatBuffer sync_staging_;  // external: the rank-ordered shards, for the param sync
  core::FlatBuffer grad_staging_;  // external, stage 1: one bucket for reduce_gradients
  core::FlatBuffer shard_grads_;   // stage 2: this rank's shard of the averaged gradients
  core::FlatBuffer hand_over_slot_;  // external on one node: this rank's slot
  std::vector<int64_t> view_offset_;  // bucket view: each param's place in flat_params_
  std::shared_ptr<const comm::NodeTopology> nodes_;  // discovered at the first shared buffer
  bool nodes_known_ = false;
  std::string node_sharing_refused_;
  std::vector<UpdateRun> runs_;
};

}  // namespace optim
}  // namespace shardopt
