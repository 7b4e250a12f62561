// src/optim/moment_layout.cpp — where a shard's moments are kept: each segment's place among the fp32 moments or the 8-bit codes and absmax blocks (its own file: the checkpoint readers link it without the optimizer).
#include "optim/shard_state.hpp"

#include "q8_state.hpp"

namespace shardopt {
namespace optim {

MomentLayout place_moments(const partition::RankShard& shard, const std::vector<bool>& q8_param) {
  MomentLayout out;
  for (const partition::Segment& s : shard.segments) {
    MomentPlace place;
    place.q8 = q8_param[static_cast<std::size_t>(s.param)];
    if (place.q8) {
      place.code_offset = out.code_numel;
      place.block_offset = out.blocks;
      out.code_numel += s.length;
      out.blocks += kernels::q8_blocks(s.length);
    } else {
      place.moment_offset = out.moment_numel;
      out.moment_numel += s.length;
    }
    out.places.push_back(place);
  }
  // Without 8-bit params the f32 moments cover the whole shard (its padding included), as the
  // checkpoint and state-dict code reads them.
  if (out.code_numel == 0) {
    out.moment_numel = shard.numel;
    for (std::size_t i = 0; i < out.places.size(); ++i) out.places[i].moment_offset = shard.segments[i].shard_offset;
  }
  return out;
}

}  // namespace optim
}  // namespace shardopt
