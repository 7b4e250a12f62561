// src/optim/moment_layout.cpp — where a shard's state is kept: each segment's place in every f32 kind's buffer, among the 8-bit codes and absmax blocks (its own file: the checkpoint readers link it without the optimizer).
#include "optim/shard_state.hpp"

#include "q8_state.hpp"

namespace shardopt {
namespace optim {

MomentLayout place_moments(const partition::RankShard& shard, const std::vector<bool>& q8_param,
                           const std::vector<StateMask>& holds) {
  MomentLayout out;
  auto holds_kind = [&](const partition::Segment& s, std::size_t k) {
    const auto param = static_cast<std::size_t>(s.param);
    return !q8_param[param] && (holds.empty() || holds[param][k]);
  };
  for (const partition::Segment& s : shard.segments) {
    MomentPlace place;
    place.q8 = q8_param[static_cast<std::size_t>(s.param)];
    if (place.q8) {
      place.code_offset = out.code_numel;
      place.block_offset = out.blocks;
      out.code_numel += s.length;
      out.blocks += kernels::q8_blocks(s.length);
    }
    place.offset[kMaster] = s.shard_offset;
    out.places.push_back(place);
  }
  out.numel[kMaster] = shard.numel;
  for (std::size_t k = 0; k < kStateKinds; ++k) {
    if (k == kMaster) continue;
    // A kind every (non-empty) segment holds, in a shard without 8-bit moments, spans the shard.
    bool whole = out.code_numel == 0;
    for (const partition::Segment& s : shard.segments) whole = whole && (s.length == 0 || holds_kind(s, k));
    if (whole) out.numel[k] = shard.numel;
    for (std::size_t i = 0; i < shard.segments.size(); ++i) {
      const partition::Segment& s = shard.segments[i];
      if (whole) {
        out.places[i].offset[k] = s.shard_offset;
      } else if (s.length > 0 && holds_kind(s, k)) {
        out.places[i].offset[k] = out.numel[k];
        out.numel[k] += s.length;
      } else {
        out.places[i].offset[k] = -1;
      }
    }
  }
  return out;
}

}  // namespace optim
}  // namespace shardopt
