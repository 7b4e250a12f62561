// src/averaging/outer_state_file.hpp — one rank's shard of the outer optimizer's state in a file of its own, with the layout it follows, and its mapping onto another layout by parameter and element range.
//
// A file holds "anchor" and "momentum" (f32, indexed like the shard that wrote it) and, in its
// metadata, what identifies those values: every registered parameter's name, size and
// trainable flag, and the shard's segments (which elements of which parameter sit where). A
// load therefore needs neither the same partition nor the same trainable flags at the time of
// the call: each element goes to wherever the loading layout keeps that parameter's element.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "averaging/model_averager_impl.hpp"
#include "checkpoint/manifest.hpp"
#include "partition/partition.hpp"

namespace shardopt {
namespace averaging {

struct OuterFile {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes `state` (anchor and momentum over `shard`, its numel elements) to dir/name atomically.
OuterFile write_outer_file(const OuterState& state, const std::vector<optim::ParamRecord>& params, const partition::RankShard& shard,
                           int local_rank, const std::string& dir, const std::string& name);

// The saved outer state of a whole replica: where each parameter's elements sit in which file.
struct SavedOuterState {
  struct Piece {
    std::size_t file = 0;
    partition::Segment segment;  // as the saving shard had it
  };
  std::vector<std::string> paths;
  std::vector<int64_t> anchor_start;    // file offsets of each file's tensors
  std::vector<int64_t> momentum_start;
  std::vector<std::vector<Piece>> by_param;  // per parameter, ordered by element
};

// Reads and checks the headers of `files` (one per rank of the saving replica) in `dir`: each
// file's size as recorded and, with `verify_checksums`, its CRC32C; that they describe the
// parameters `params` (the replica checkpoint's manifest: names, sizes, trainable flags) with
// Error(mismatch)/Error(corrupt) naming the file and the first parameter that differs; and that
// their segments tile every trainable parameter exactly once.
SavedOuterState read_outer_layout(const std::string& dir, const std::vector<OuterFile>& files,
                                  const std::vector<checkpoint::ManifestParam>& params, bool verify_checksums);

// The saved values over `shard` (this rank's shard of the loading layout): every segment's
// elements read from the files that hold them, padding zero. Error(corrupt) naming the
// parameter when an element is not in the saved state (its trainable flags differ).
void map_outer_state(const SavedOuterState& saved, const std::vector<optim::ParamRecord>& params, const partition::RankShard& shard,
                     OuterState& into);

}  // namespace averaging
}  // namespace shardopt
