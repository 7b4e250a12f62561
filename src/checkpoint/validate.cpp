// src/checkpoint/validate.cpp — the shard-file half of the one validation path (the manifest half is read_manifest).
#include "checkpoint/validate.hpp"

namespace shardopt {
namespace checkpoint {

void check_checkpoint_files(CheckpointReader& reader, FileShare share, const CheckpointProgress& progress) {
  const Manifest& m = reader.manifest();
  // Presence and size of all first: a missing file is reported as missing, whichever rank
  // would have read it.
  for (std::size_t f = 0; f < m.files.size(); ++f) reader.check_present(f);
  int64_t total = 0;
  for (std::size_t f = 0; f < m.files.size(); ++f) total += share.includes(f) ? m.files[f].bytes : 0;
  int64_t done = 0;
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    if (!share.includes(f)) continue;
    if (progress) progress("verify", done, total);
    reader.check_header(f);
    reader.verify_checksum(f);
    done += m.files[f].bytes;
  }
  if (progress) progress("verify", total, total);
}

CheckpointReader open_checked_checkpoint(const std::string& dir, FileShare share, const CheckpointProgress& progress) {
  CheckpointReader reader(dir, read_manifest(dir));
  check_checkpoint_files(reader, share, progress);
  return reader;
}

}  // namespace checkpoint
}  // namespace shardopt
