// src/optim/shard_state.cpp — layout rebuilds (the migration itself: shard_migration.cpp), update runs, masters, and the checkpoint interface of the shard.
#include "optim/shard_state.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "comm/node_shared_memory.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
#include "mixed_update.hpp"
#include "optim/device_update.hpp"

namespace shardopt {
namespace optim {

partition::Strategy strategy_of(const OptimizerConfig& config) {
  if (!config.shard_state) return partition::Strategy::replicated;
  return config.partition == PartitionStrategy::flat ? partition::Strategy::flat : partition::Strategy::sorted_greedy;
}

StateMask ShardState::state_kinds_needed() const {
  StateMask needed = optim::state_kinds_needed(table_.algorithms(), dtype(), table_.groups());
  // remainder16 groups keep their masters in remainders_: the fp32 kind exists for fp32 groups
  // (or as materialise_masters()' copy, which state_in_use_ then shows).
  if (dtype() != DType::f32 && !table_.any_master(MasterStorage::fp32)) needed[kMaster] = false;
  // State once created is kept, as torch keeps it when momentum or amsgrad is switched off.
  for (std::size_t k = 0; k < kStateKinds; ++k) needed[k] = needed[k] || state_in_use_[k];
  return needed;
}

std::vector<bool> ShardState::q8_flags() const {
  std::vector<bool> q8_param;
  for (const ParamRecord& p : table_.params()) q8_param.push_back(table_.q8_moments(p));
  return q8_param;
}

MomentLayout ShardState::place_moments_flagged(const partition::RankShard& shard, std::vector<bool> q8_param) const {
  q8_param.resize(table_.size(), false);
  std::vector<StateMask> holds;
  for (const ParamRecord& p : table_.params()) holds.push_back(algorithm_kinds(table_.algorithm(p.group)));
  return optim::place_moments(shard, q8_param, holds);
}

MomentLayout ShardState::place_moments(const partition::RankShard& shard) const {
  return place_moments_flagged(shard, q8_flags());
}

kernels::Q8Moments ShardState::q8_moments(const UpdateRun& run) const {
  return kernels::Q8Moments{static_cast<uint8_t*>(q8_codes_[0].raw()) + run.code_offset,
                            static_cast<uint8_t*>(q8_codes_[1].raw()) + run.code_offset,
                            q8_absmax_[0].data() + run.block_offset, q8_absmax_[1].data() + run.block_offset};
}

int64_t ShardState::q8_bytes() const {
  return q8_codes_[0].bytes() + q8_codes_[1].bytes() + q8_absmax_[0].bytes() + q8_absmax_[1].bytes();
}

void ShardState::ensure_state_kinds() {
  // amsgrad may be switched on between steps; the ranks agreed on the hyperparameters, so each
  // refuses alike, before anything is updated.
  for (int g = 0; g < table_.num_groups(); ++g) {
    SHARDOPT_CHECK(table_.storage(g).state_precision != StatePrecision::q8 || !table_.groups()[static_cast<std::size_t>(g)].amsgrad,
                   invalid_argument,
                   "param group {}: amsgrad cannot be switched on for state_precision = q8 (max_exp_avg_sq has no "
                   "8-bit form)",
                   g);
  }
  // The update changes the masters: a checkpoint's materialised copy would go stale.
  if (masters_materialised_) {
    masters_materialised_ = false;
    if (!table_.any_master(MasterStorage::fp32)) {
      state_[kMaster] = dev_.new_buffer(0);
      state_in_use_[kMaster] = false;
    }
  }
  const StateMask needed = state_kinds_needed();
  for (std::size_t k = 0; k < kStateKinds; ++k) {
    if (needed[k] && state_[k].numel() != state_numel_[k]) state_[k].resize(state_numel_[k]);
  }
  state_in_use_ = needed;
}

void ShardState::rebuild(const std::vector<const void*>& initial, std::size_t first_new) {
  const device::ScopedDevice scope(dev_.device());
  const std::vector<ParamRecord>& params = table_.params();
  const DType dt = dtype();
  partition::Layout next = partition::make_layout(strategy_of(config_), table_.infos(), dev_.world(), kShardAlignment);
  const partition::RankShard& own = next.shards[static_cast<std::size_t>(dev_.rank())];
  const int64_t next_shard = own.numel;
  const MomentLayout moments = place_moments(own);
  LayoutChange change{layout_, {}, own, moments};
  if (has_layout_) {
    for (const partition::RankShard& shard : layout_.shards) change.from_places.push_back(place_moments_flagged(shard, q8_laid_out_));
  }

  // Every kind gets the device, even when empty: ensure_state_kinds() may allocate it later.
  StateBuffers next_state;
  const StateMask needed = state_kinds_needed();
  for (std::size_t k = 0; k < kStateKinds; ++k) {
    next_state[k] = dev_.new_buffer(needed[k] ? moments.numel[k] : 0);
  }
  if (has_layout_) migrate_state(change, next_state);
  state_numel_ = moments.numel;
  // Fresh 8-bit state is bitsandbytes' zeros: codes 0 and absmax 0.
  Q8Buffers next_q8;
  for (std::size_t m = 0; m < 2; ++m) {
    next_q8.codes[m] = dev_.new_buffer(moments.code_numel, DType::byte);
    next_q8.absmax[m] = dev_.new_buffer(moments.blocks);
    if (moments.code_numel > 0) {
      dev_.zero_bytes(next_q8.codes[m].raw(), static_cast<std::size_t>(next_q8.codes[m].bytes()));
      dev_.zero_bytes(next_q8.absmax[m].raw(), static_cast<std::size_t>(next_q8.absmax[m].bytes()));
    }
  }
  if (has_layout_) migrate_q8(change, next_q8);
  for (std::size_t m = 0; m < 2; ++m) {
    q8_codes_[m] = std::move(next_q8.codes[m]);
    q8_absmax_[m] = std::move(next_q8.absmax[m]);
  }
  q8_laid_out_ = q8_flags();
  state_in_use_ = needed;
  // Remainders (2 bytes each, moved as raw bf16 bits) wherever a group keeps them; a layout
  // that had none (no such group yet) leaves them zero, which seed_masters() sets anyway.
  const bool remainders_needed = table_.any_master(MasterStorage::remainder16);
  core::FlatBuffer next_remainders = dev_.new_buffer(remainders_needed ? next_shard : 0, DType::bf16);
  if (has_layout_ && remainders_in_use_) migrate_buffer(change, remainders_, next_remainders, DType::bf16, kMaster);
  remainders_ = std::move(next_remainders);
  remainders_in_use_ = remainders_needed;

  NodeGradSlots next_slots;
  core::FlatBuffer next_hand_over_slot = dev_.new_buffer(0, dt);
  if (bucket_view()) {
    std::vector<int64_t> next_offset(params.size());
    int64_t tail = next.buffer_numel;
    for (std::size_t i = 0; i < params.size(); ++i) {
      next_offset[i] = params[i].trainable ? next.param_offset[i] : tail;
      if (!params[i].trainable) tail += params[i].numel;
    }
    core::FlatBuffer next_params = new_param_buffer(tail);
    // Stage 2 keeps no whole-model gradient buffer of its own, except on one node: there the
    // rank's node-shared slot is its gradient buffer as at stage 1 (grad_view() writes it, or
    // reduce_gradient() copies into it), and the owners sum their shards over the slots.
    // With config.overlap the slots carry a counter pair per overlap bucket.
    const int64_t buckets = config_.overlap == OverlapPolicy::off
                                ? 0
                                : (next.buffer_numel + bucket_elements(config_, dt) - 1) / bucket_elements(config_, dt);
    core::FlatBuffer next_grads = stage2() ? map_grad_slots(tail, next_params.borrowed(), next_slots, buckets)
                                           : new_grad_buffer(tail, next_params.borrowed(), next_slots, buckets);
    fill_params(next_params, next, next_offset, initial, first_new);
    // Gradients written through views survive the layout change, as at stage 1.
    if (next_grads.numel() > 0 && flat_grads_.numel() > 0) {
      for (std::size_t i = 0; i < std::min(params.size(), view_offset_.size()); ++i) {
        const std::size_t bytes = span_bytes(params[i].numel, dt);
        if (bytes != 0) dev_.copy_bytes(next_grads.at(next_offset[i]), flat_grads_.at(view_offset_[i]), bytes);
      }
    }
    // The caller may reuse its initial-value buffers as soon as registration returns.
    if (!initial.empty()) dev_.synchronize("initial parameter values");
    flat_params_ = std::move(next_params);
    flat_grads_ = std::move(next_grads);
    view_offset_ = std::move(next_offset);
  } else {
    sync_staging_ = sharded() ? new_param_buffer(next.buffer_numel) : dev_.new_buffer(0, dt);
    const bool hand_over_on_node = config_.overlap == OverlapPolicy::off;
    if (hand_over_on_node) next_hand_over_slot = map_grad_slots(next.buffer_numel, sync_staging_.borrowed(), next_slots, 0);
    const bool staged = dev_.world() > 1 && !stage2() && next_slots.slots.empty();
    grad_staging_ = dev_.new_buffer(staged ? std::min(next.trainable_numel, bucket_elements(config_, dt)) : 0, dt);
  }
  grad_slots_ = std::move(next_slots);
  hand_over_slot_ = std::move(next_hand_over_slot);
  // Stage 2 on one node: this rank's shard of the average is summed in place into its own slot,
  // at the shard's own positions, which no other rank reads (each sums only its own positions
  // over the slots). No shard gradient buffer of its own, and the sum writes the lines it has
  // just read instead of a third stream. Across nodes the hierarchical reduction publishes the
  // average into every slot and copies the shard out: a buffer of its own there.
  const core::FlatBuffer& own_slot = bucket_view() ? flat_grads_ : hand_over_slot_;
  if (stage2() && !grad_slots_.slots.empty() && grad_slots_.cross == nullptr && next_shard > 0) {
    const int64_t own_offset = next.shards[static_cast<std::size_t>(dev_.rank())].offset;
    shard_grads_ = core::FlatBuffer::over_mapping(std::const_pointer_cast<void>(own_slot.keeper()),
                                                  own_slot.at(own_offset), next_shard, dt);
  } else {
    shard_grads_ = dev_.new_buffer(stage2() ? next_shard : 0, dt);
  }
  state_ = std::move(next_state);
  layout_ = std::move(next);
  has_layout_ = true;
  ++layout_version_;
  ++values_generation_;
  refresh_runs();
  // bf16/f16: params that have not stepped (new, or thawed) start their master at their value;
  // the others keep the master migrated above.
  std::vector<bool> fresh(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) fresh[i] = params[i].trainable && params[i].step == 0;
  seed_masters(fresh);
  // A node-shared buffer: no rank goes on (and perhaps writes parameters through its views)
  // before every rank of the node has written its part and read what it needs (the masters).
  if (const comm::NodeTopology* nodes = node_sharing()) nodes->node->barrier();
}

core::FlatBuffer ShardState::new_param_buffer(int64_t numel) {
  const DType dt = dtype();
  const bool applies = config_.node_shared_params && sharded() && !dev_.on_device() && numel > 0;
  if (!applies) return dev_.new_buffer(numel, dt);
  if (!nodes_known_) {
    nodes_ = comm::discover_nodes(dev_.comm());
    nodes_known_ = true;
  }
  // Nodes of one rank each gain nothing from sharing.
  if (!nodes_ || nodes_->largest_node < 2) return dev_.new_buffer(numel, dt);
  std::string why_not;
  comm::NodeSharedBuffer mapped =
      comm::map_node_shared(*nodes_->node, core::FlatBuffer::allocation_bytes(numel, dt), why_not);
  // Every node shares or none does: the sync must be the same on every rank.
  const std::vector<uint8_t> mapped_on =
      comm::all_gather_records(dev_.comm(), static_cast<uint8_t>(mapped.data != nullptr ? 1 : 0));
  const auto failed = std::find(mapped_on.begin(), mapped_on.end(), uint8_t{0});
  if (failed == mapped_on.end()) {
    node_sharing_refused_.clear();
    return core::FlatBuffer::over_mapping(std::move(mapped.mapping), mapped.data, numel, dt);
  }
  node_sharing_refused_ =
      why_not.empty() ? fmt::format("the node of rank {} could not share its parameters", failed - mapped_on.begin())
                      : why_not;
  return dev_.new_buffer(numel, dt);
}

core::FlatBuffer ShardState::new_grad_buffer(int64_t numel, bool params_shared, NodeGradSlots& slots,
                                             int64_t buckets) {
  core::FlatBuffer slot = map_grad_slots(numel, params_shared, slots, buckets);
  return slots.slots.empty() ? dev_.new_buffer(numel, dtype()) : std::move(slot);
}

core::FlatBuffer ShardState::map_grad_slots(int64_t numel, bool params_shared, NodeGradSlots& slots, int64_t buckets) {
  const DType dt = dtype();
  // Across nodes the slots serve the hierarchical reduction when every node has the same number
  // of ranks (each rank then has a carrier group: the ranks of its place on the other nodes)
  // and config.overlap is off (its per-bucket counters reduce on one node only); otherwise the
  // reduction stays MPI's (one buffer per rank). Decided alike on every rank.
  if (!params_shared || !nodes_ || numel <= 0) return dev_.new_buffer(0, dt);
  const bool one_node = nodes_->nodes == 1;
  const bool uniform = nodes_->nodes * nodes_->largest_node == dev_.world();
  if (!one_node && (!uniform || buckets > 0 || !nodes_->cross)) return dev_.new_buffer(0, dt);
  Communicator& node = *nodes_->node;
  const std::size_t slot_bytes = core::FlatBuffer::allocation_bytes(numel, dt);
  std::string why_not;
  const std::size_t all_slots = slot_bytes * static_cast<std::size_t>(node.size());
  // After the slots: two counters per bucket (see NodeGradSlots), zero-filled by the mapping.
  const std::size_t counter_bytes = 2 * sizeof(uint64_t) * static_cast<std::size_t>(buckets);
  comm::NodeSharedBuffer mapped = comm::map_node_shared(node, all_slots + counter_bytes, why_not);
  // map_node_shared fails on all of a node's ranks or on none; across nodes every node must
  // have its slots or none may use them (the reduction is the same on every rank).
  bool everywhere = mapped.data != nullptr;
  if (!one_node) {
    const std::vector<uint8_t> mapped_on = comm::all_gather_records(dev_.comm(), static_cast<uint8_t>(everywhere));
    everywhere = std::find(mapped_on.begin(), mapped_on.end(), uint8_t{0}) == mapped_on.end();
  }
  if (!everywhere) return dev_.new_buffer(0, dt);
  slots.node = nodes_->node;
  if (!one_node) slots.cross = nodes_->cross;
  if (buckets > 0) {
    slots.handed = reinterpret_cast<uint64_t*>(static_cast<char*>(mapped.data) + all_slots);
    slots.reduced = slots.handed + buckets;
    slots.buckets = buckets;
  }
  for (int r = 0; r < node.size(); ++r) {
    slots.slots.push_back(static_cast<char*>(mapped.data) + slot_bytes * static_cast<std::size_t>(r));
  }
  return core::FlatBuffer::over_mapping(std::move(mapped.mapping), slots.slots[static_cast<std::size_t>(node.rank())],
                                        numel, dt);
}

void ShardState::fill_params(core::FlatBuffer& next_params, const partition::Layout& next,
                             const std::vector<int64_t>& next_offset, const std::vector<const void*>& initial,
                             std::size_t first_new) const {
  const std::vector<ParamRecord>& params = table_.params();
  const DType dt = dtype();
  // Elements [offset, offset+count) of param i into the new buffer, from where they are now.
  auto copy = [&](std::size_t i, int64_t offset, int64_t count) {
    const std::size_t bytes = span_bytes(count, dt);
    if (bytes == 0) return;
    if (i < view_offset_.size()) {
      dev_.copy_bytes(next_params.at(next_offset[i] + offset), flat_params_.at(view_offset_[i] + offset), bytes);
    } else if (i >= first_new && i - first_new < initial.size() && initial[i - first_new] != nullptr) {
      dev_.copy_bytes(next_params.at(next_offset[i] + offset), element(initial[i - first_new], offset, dt),
                      bytes);
    }
  };
  const comm::NodeTopology* nodes = next_params.borrowed() ? nodes_.get() : nullptr;
  if (nodes == nullptr) {
    for (std::size_t i = 0; i < params.size(); ++i) copy(i, 0, params[i].numel);
    return;
  }
  const int me = dev_.rank();
  const int my_node = nodes->node_of[static_cast<std::size_t>(me)];
  const bool first_on_node = nodes->node->rank() == 0;
  for (std::size_t r = 0; r < next.shards.size(); ++r) {
    const bool writer = nodes->node_of[r] == my_node ? static_cast<int>(r) == me : first_on_node;
    if (!writer) continue;
    for (const partition::Segment& s : next.shards[r].segments) copy(static_cast<std::size_t>(s.param), s.param_offset, s.length);
  }
  if (first_on_node) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) copy(i, 0, params[i].numel);
    }
  }
}

void* ShardState::param_ptr(std::size_t i) const {
  return bucket_view() ? static_cast<void*>(flat_params_.at(view_offset_[i])) : table_.params()[i].user_param;
}

void* ShardState::grad_ptr(std::size_t i) const {
  if (!bucket_view()) return table_.params()[i].user_grad;
  return stage2() && flat_grads_.numel() == 0 ? nullptr : static_cast<void*>(flat_grads_.at(view_offset_[i]));
}

void ShardState::refresh_runs() {
  runs_.clear();
  const std::vector<ParamRecord>& params = table_.params();
  const DType dt = dtype();
  const MomentLayout moments = place_moments(own_shard());
  // A segment continues a run where each kind the run keeps goes on right after it.
  auto follows = [](const UpdateRun& run, const MomentPlace& place) {
    for (std::size_t k = 0; k < kStateKinds; ++k) {
      const bool held = run.state_offset[k] >= 0;
      if (held != (place.offset[k] >= 0) || (held && run.state_offset[k] + run.length != place.offset[k])) return false;
    }
    return true;
  };
  for (std::size_t si = 0; si < own_shard().segments.size(); ++si) {
    const partition::Segment& s = own_shard().segments[si];
    const MomentPlace& place = moments.places[si];
    if (s.length == 0) continue;
    const ParamRecord& p = params[static_cast<std::size_t>(s.param)];
    if (p.sits_out_step) continue;  // this step leaves it as it is
    char* param_at = element(param_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dt);
    char* grad_at = stage2() ? shard_grads_.at(s.shard_offset)
                             : element(grad_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dt);
    const int64_t index = p.first_index + s.param_offset;
    if (!runs_.empty()) {
      UpdateRun& last = runs_.back();
      const ParamRecord& q = params[static_cast<std::size_t>(last.first_param)];
      const std::size_t run_bytes = span_bytes(last.length, dt);
      // An 8-bit run is one parameter's segment (its blocks are the parameter's).
      const bool contiguous = last.shard_offset + last.length == s.shard_offset && last.param + run_bytes == param_at &&
                              last.grad + run_bytes == grad_at && last.first_index + last.length == index &&
                              !last.q8 && !place.q8 && follows(last, place);
      // A Muon matrix is its own run: its update needs it whole, and only it.
      const bool matrix = table_.algorithm(p.group) == Algorithm::muon;
      if (contiguous && !matrix && q.group == p.group && q.step == p.step &&
          q.has_momentum_buffer == p.has_momentum_buffer) {
        last.length += s.length;
        continue;
      }
    }
    runs_.push_back(UpdateRun{s.param, s.shard_offset, s.length, param_at, grad_at, index, place.offset, place.q8,
                              place.code_offset, place.block_offset});
  }
}

void ShardState::seed_masters(const std::vector<bool>& params_to_seed) {
  if (dtype() == DType::f32) return;
  float* master = state_[kMaster].data();
  for (const partition::Segment& s : own_shard().segments) {
    if (s.length == 0 || !params_to_seed[static_cast<std::size_t>(s.param)]) continue;
    if (remainder_master(table_.params()[static_cast<std::size_t>(s.param)])) {
      // A zero remainder: the master is the parameter's value, as a widened fp32 master.
      dev_.zero_bytes(master_remainders() + s.shard_offset, span_bytes(s.length, DType::bf16));
      continue;
    }
    const char* values = element(param_ptr(static_cast<std::size_t>(s.param)), s.param_offset, dtype());
    if (dev_.on_device()) {
      dev_.ops().widen(values, dtype(), master + s.shard_offset, s.length, dev_.stream());
    } else {
      kernels::widen_cpu(values, dtype(), master + s.shard_offset, s.length, config_.cpu_threads);
    }
  }
}

const float* ShardState::param_values_f32(std::size_t i, int64_t offset, int64_t n, std::vector<float>& scratch) const {
  const char* at = element(param_ptr(i), offset, dtype());
  if (dtype() == DType::f32) return reinterpret_cast<const float*>(at);
  scratch.resize(static_cast<std::size_t>(n));
  kernels::widen_cpu(at, dtype(), scratch.data(), n, config_.cpu_threads);
  return scratch.data();
}

void ShardState::set_param_values_f32(std::size_t i, int64_t offset, int64_t n, const float* values) {
  const comm::NodeTopology* nodes = node_sharing();
  if (bucket_view() && nodes != nullptr && !table_.params()[i].trainable && nodes->node->rank() != 0) return;
  char* at = element(param_ptr(i), offset, dtype());
  if (dev_.on_device()) {
    // Device to device, on the optimizer's stream: later steps see the values in order.
    if (dtype() != DType::f32) {
      dev_.ops().narrow(values, at, dtype(), n, dev_.stream());
    } else {
      dev_.copy_bytes(at, values, span_bytes(n, dtype()));
    }
  } else if (dtype() != DType::f32) {
    kernels::narrow_cpu(values, at, dtype(), n, config_.cpu_threads);
  } else {
    std::memcpy(at, values, span_bytes(n, dtype()));
  }
}

void ShardState::install_state(const StateMask& kinds, StateBuffers buffers, const std::vector<bool>& without_master,
                               Q8Buffers q8) {
  const int64_t numel = own_shard().numel;
  for (std::size_t k = 0; k < kStateKinds; ++k) {
    const int64_t expected = state_numel_[k];
    SHARDOPT_CHECK(!kinds[k] || buffers[k].numel() == expected, internal,
                   "install_state: '{}' has {} elements, the shard keeps {}", kStateNames[k], buffers[k].numel(),
                   expected);
  }
  for (std::size_t m = 0; m < 2; ++m) {
    SHARDOPT_CHECK(q8.codes[m].numel() == q8_codes_[m].numel() && q8.absmax[m].numel() == q8_absmax_[m].numel(),
                   internal, "install_state: 8-bit moments of {} codes and {} blocks, the shard keeps {} and {}",
                   q8.codes[m].numel(), q8.absmax[m].numel(), q8_codes_[m].numel(), q8_absmax_[m].numel());
  }
  for (std::size_t k = 0; k < kStateKinds; ++k) state_[k] = kinds[k] ? std::move(buffers[k]) : dev_.new_buffer(0);
  for (std::size_t m = 0; m < 2; ++m) {
    if (q8_codes_[m].numel() == 0) continue;
    q8_codes_[m] = std::move(q8.codes[m]);
    q8_absmax_[m] = std::move(q8.absmax[m]);
  }
  state_in_use_ = kinds;
  masters_materialised_ = false;
  if (dtype() != DType::f32) {
    std::vector<bool> seed = without_master;
    seed.resize(table_.size(), false);
    if (!kinds[kMaster]) {
      state_[kMaster] = dev_.new_buffer(numel);
      state_in_use_[kMaster] = true;
      std::fill(seed.begin(), seed.end(), true);
    }
    split_masters(seed);
    seed_masters(seed);
    if (!table_.any_master(MasterStorage::fp32)) {
      state_[kMaster] = dev_.new_buffer(0);
      state_in_use_[kMaster] = false;
    }
  }
  refresh_runs();
  ++values_generation_;
}

void ShardState::split_masters(const std::vector<bool>& params_to_seed) {
  if (!table_.any_master(MasterStorage::remainder16)) return;
  SHARDOPT_CHECK(!dev_.on_device(), internal, "master remainders on a device (registration refuses them)");
  const float* master = state_[kMaster].data();
  int16_t* remainder = master_remainders();
  for (const partition::Segment& s : own_shard().segments) {
    const auto i = static_cast<std::size_t>(s.param);
    // Params to seed keep the loaded value and take a zero remainder (seed_masters).
    if (s.length == 0 || params_to_seed[i] || !remainder_master(table_.params()[i])) continue;
    auto* param = reinterpret_cast<uint16_t*>(element(param_ptr(i), s.param_offset, dtype()));
    for (int64_t e = 0; e < s.length; ++e) {
      const float m = master[s.shard_offset + e];
      param[e] = kernels::param_of_master(m);
      remainder[s.shard_offset + e] = kernels::remainder_of_master(m);
    }
  }
}

void ShardState::materialise_masters() {
  if (dtype() == DType::f32 || !table_.any_master(MasterStorage::remainder16)) return;
  SHARDOPT_CHECK(!dev_.on_device(), internal, "master remainders on a device (registration refuses them)");
  const int64_t numel = own_shard().numel;
  if (state_[kMaster].numel() != numel) state_[kMaster] = dev_.new_buffer(numel);
  state_in_use_[kMaster] = true;
  masters_materialised_ = true;
  float* master = state_[kMaster].data();
  const int16_t* remainder = master_remainders();
  for (const partition::Segment& s : own_shard().segments) {
    const auto i = static_cast<std::size_t>(s.param);
    if (s.length == 0 || !remainder_master(table_.params()[i])) continue;
    const auto* param = reinterpret_cast<const uint16_t*>(element(param_ptr(i), s.param_offset, dtype()));
    for (int64_t e = 0; e < s.length; ++e) {
      master[s.shard_offset + e] = kernels::master_from_remainder(param[e], remainder[s.shard_offset + e]);
    }
  }
}

}  // namespace optim
}  // namespace shardopt
