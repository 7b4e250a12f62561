// src/checkpoint/validate.hpp — the one validation path of a checkpoint: what verify, info, export, reshard, load and a save's proof all run.
//
// A checkpoint is valid when its manifest passes read_manifest() (its own checksum, format
// version, every field's type and range, check_manifest()) and every shard file it names is
// present with the manifest's size, a header holding exactly what the manifest promises, and
// the manifest's CRC32C. Nothing checks a checkpoint any other way, so nothing verifies that
// would not load, and nothing loads that would not verify.
#pragma once

#include <string>

#include "checkpoint/store.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {
namespace checkpoint {

// Which shard files a caller reads in full (header and CRC32C): file f when f % count == index.
// Every caller checks every file's presence and size. A load spreads the files over its ranks,
// which then agree on the outcome, so that together they run every check once.
struct FileShare {
  int index = 0;
  int count = 1;
  bool includes(std::size_t file) const { return static_cast<int>(file % static_cast<std::size_t>(count)) == index; }
};

// The file checks over `reader`, whose manifest passed check_manifest(). `progress`, when set,
// hears "verify" with the bytes checked so far.
void check_checkpoint_files(CheckpointReader& reader, FileShare share = {}, const CheckpointProgress& progress = {});

// read_manifest(dir), then check_checkpoint_files(): the whole of it, ready to read from.
CheckpointReader open_checked_checkpoint(const std::string& dir, FileShare share = {},
                                         const CheckpointProgress& progress = {});

}  // namespace checkpoint
}  // namespace shardopt
