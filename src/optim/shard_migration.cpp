// src/optim/shard_migration.cpp — moving a shard's state from one layout to the next (set_trainable, add_param_group): each f32 kind, the remainders and the 8-bit moments, broadcast by their old owners.
#include <algorithm>
#include <utility>
#include <vector>

#include "comm/raw_collectives.hpp"
#include "optim/shard_state.hpp"

namespace shardopt {
namespace optim {

void ShardState::migrate_state(const LayoutChange& change, StateBuffers& next) const {
  for (std::size_t k = 0; k < kStateKinds; ++k) {
    // Decided alike on every rank: a rank whose shard is empty still joins the broadcasts.
    if (state_in_use_[k]) migrate_buffer(change, state_[k], next[k], DType::f32, k);
  }
}

void ShardState::migrate_buffer(const LayoutChange& change, const core::FlatBuffer& old, core::FlatBuffer& next,
                                DType dt, std::size_t kind) const {
  const partition::Layout& from = change.from;
  // This rank's new pieces, by param: (segment, offset in `next`).
  std::vector<std::vector<std::pair<const partition::Segment*, int64_t>>> mine(table_.size());
  for (std::size_t i = 0; i < change.own.segments.size(); ++i) {
    const int64_t at = change.own_places.places[i].offset[kind];
    if (at >= 0) mine[static_cast<std::size_t>(change.own.segments[i].param)].emplace_back(&change.own.segments[i], at);
  }
  const bool replicated = from.strategy == partition::Strategy::replicated;
  const int world = dev_.world();
  const int sources = replicated ? 1 : world;
  // One receive buffer for every broadcast (on a device, each allocation would cost a cudaFree).
  core::FlatBuffer incoming(dev_.device(), dev_.stream(), dt);
  int64_t largest = 0;
  for (const MomentLayout& places : change.from_places) largest = std::max(largest, places.numel[kind]);
  for (int r = 0; r < sources; ++r) {
    const auto source_rank = static_cast<std::size_t>(replicated ? dev_.rank() : r);
    const partition::RankShard& old_shard = from.shards[source_rank];
    const MomentLayout& old_places = change.from_places[source_rank];
    const int64_t old_numel = old_places.numel[kind];
    const char* source = static_cast<const char*>(old.raw());
    if (!replicated && world > 1) {
      if (incoming.empty()) incoming.resize(largest);
      if (r == dev_.rank()) dev_.copy_bytes(incoming.raw(), old.raw(), span_bytes(old_numel, dt));
      dev_.settle_before_collective();
      comm::broadcast_in_chunks(dev_.comm(), incoming.raw(), old_numel, dt, r, bucket_elements(config_, dt));
      source = static_cast<const char*>(incoming.raw());
    }
    for (std::size_t i = 0; i < old_shard.segments.size(); ++i) {
      const partition::Segment& old_seg = old_shard.segments[i];
      const int64_t old_at = old_places.places[i].offset[kind];
      if (old_at < 0) continue;
      for (const auto& [new_seg, new_at] : mine[static_cast<std::size_t>(old_seg.param)]) {
        const int64_t lo = std::max(old_seg.param_offset, new_seg->param_offset);
        const int64_t hi = std::min(old_seg.param_offset + old_seg.length, new_seg->param_offset + new_seg->length);
        if (lo >= hi) continue;
        dev_.copy_bytes(element(next.raw(), new_at + (lo - new_seg->param_offset), dt),
                        element(source, old_at + (lo - old_seg.param_offset), dt), span_bytes(hi - lo, dt));
      }
    }
  }
}

void ShardState::migrate_q8(const LayoutChange& change, Q8Buffers& next) const {
  // Where each 8-bit param of this rank's new shard keeps its codes and blocks. An 8-bit param is
  // one segment, the whole param, in every layout (the partition keeps it whole).
  std::vector<const MomentPlace*> mine(table_.size(), nullptr);
  for (std::size_t i = 0; i < change.own.segments.size(); ++i) {
    if (change.own_places.places[i].q8 && change.own.segments[i].length > 0) {
      mine[static_cast<std::size_t>(change.own.segments[i].param)] = &change.own_places.places[i];
    }
  }
  const bool replicated = change.from.strategy == partition::Strategy::replicated;
  const int world = dev_.world();
  int64_t largest_codes = 0;
  int64_t largest_blocks = 0;
  for (const MomentLayout& places : change.from_places) {
    largest_codes = std::max(largest_codes, places.code_numel);
    largest_blocks = std::max(largest_blocks, places.blocks);
  }
  if (largest_codes == 0) return;  // decided alike on every rank: the old layout held no 8-bit moments
  // One receive buffer of each for every broadcast.
  Q8Buffers incoming;
  const bool broadcast = !replicated && world > 1;
  for (std::size_t m = 0; m < 2 && broadcast; ++m) {
    incoming.codes[m] = dev_.new_buffer(largest_codes, DType::byte);
    incoming.absmax[m] = dev_.new_buffer(largest_blocks);
  }
  for (int r = 0; r < (replicated ? 1 : world); ++r) {
    const auto source_rank = static_cast<std::size_t>(replicated ? dev_.rank() : r);
    const partition::RankShard& old_shard = change.from.shards[source_rank];
    const MomentLayout& old = change.from_places[source_rank];
    if (old.code_numel == 0) continue;
    for (std::size_t m = 0; m < 2 && broadcast; ++m) {
      if (r == dev_.rank()) {
        dev_.copy_bytes(incoming.codes[m].raw(), q8_codes_[m].raw(), span_bytes(old.code_numel, DType::byte));
        dev_.copy_bytes(incoming.absmax[m].raw(), q8_absmax_[m].raw(), span_bytes(old.blocks, DType::f32));
      }
      comm::broadcast_in_chunks(dev_.comm(), incoming.codes[m].raw(), old.code_numel, DType::byte, r,
                                bucket_elements(config_, DType::byte));
      comm::broadcast_in_chunks(dev_.comm(), incoming.absmax[m].raw(), old.blocks, DType::f32, r,
                                bucket_elements(config_, DType::f32));
    }
    for (std::size_t i = 0; i < old_shard.segments.size(); ++i) {
      const partition::Segment& s = old_shard.segments[i];
      const MomentPlace* to = mine[static_cast<std::size_t>(s.param)];
      if (!old.places[i].q8 || s.length == 0 || to == nullptr) continue;
      for (std::size_t m = 0; m < 2; ++m) {
        const core::FlatBuffer& codes = broadcast ? incoming.codes[m] : q8_codes_[m];
        const core::FlatBuffer& absmax = broadcast ? incoming.absmax[m] : q8_absmax_[m];
        dev_.copy_bytes(static_cast<char*>(next.codes[m].raw()) + to->code_offset,
                        static_cast<const char*>(codes.raw()) + old.places[i].code_offset, span_bytes(s.length, DType::byte));
        dev_.copy_bytes(next.absmax[m].data() + to->block_offset, absmax.data() + old.places[i].block_offset,
                        span_bytes(kernels::q8_blocks(s.length), DType::f32));
      }
    }
  }
}

}  // namespace optim
}  // namespace shardopt
