// src/checkpoint/store.hpp — reading parameter pieces out of a checkpoint and writing shard files and manifests.
//
// Shared by ZeroOptimizer::save/load (sharded_checkpoint.cpp) and the offline tools
// (offline.cpp), so both read and write exactly the same format.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"
#include "optim/shard_state.hpp"

namespace shardopt {
namespace checkpoint {

// The tensors of a shard file's 8-bit moments (shard format 2), by moment (0: exp_avg, 1:
// exp_avg_sq): U8 codes, and F32 absmax per block of 256 elements of each parameter.
inline constexpr const char* kQ8CodesTensor[2] = {"exp_avg.q8_codes", "exp_avg_sq.q8_codes"};
inline constexpr const char* kQ8AbsmaxTensor[2] = {"exp_avg.q8_absmax", "exp_avg_sq.q8_absmax"};

// How a shard file keeps its state: the optimizer's own placement (optim::place_moments), so a
// save writes its buffers as they are. Shard format 1: every kind spans the shard. Format 2 (a
// file holding 8-bit moments): the f32 moment kinds (all but "master") over its other segments
// only, packed in segment order without padding, and the 8-bit codes and absmax packed alike
// over the 8-bit segments. Format 3 (a manifest with moments_by_algorithm): each moment kind
// only over the segments of params whose algorithm keeps it (a Muon matrix no exp_avg, an AdamW
// vector no momentum_buffer), packed, unless every segment keeps it (then it spans the shard).
struct FileMoments {
  int format = kShardFormatVersion;
  std::array<int64_t, optim::kStateKinds> numel{};  // elements of each state kind's tensor
  int64_t code_numel = 0;
  int64_t blocks = 0;
  bool q8() const { return code_numel > 0; }
  // A file whose every kind spans a shard of `shard_numel` (format 1).
  static FileMoments whole_shard(int64_t shard_numel);
};
// Per param of `manifest`: which kinds its shard files keep room for (optim::algorithm_kinds
// of its group's algorithm where the manifest places moments by algorithm; empty otherwise:
// every param every kind).
std::vector<optim::StateMask> moment_holders(const Manifest& manifest);
// Whether the manifest's params keep differing moment kinds (Muon or SGD beside Adam/AdamW): a
// save then places moments by algorithm (Manifest::moments_by_algorithm, shard format 3).
bool moment_kinds_differ(const Manifest& manifest);
// Where a shard file of `manifest` over `shard` keeps each segment's state.
optim::MomentLayout file_layout(const Manifest& manifest, const partition::RankShard& shard);
FileMoments file_moments(const Manifest& manifest, const partition::RankShard& shard);
FileMoments file_moments(const Manifest& manifest, std::size_t file);

// One checkpoint directory opened for reading. Reads are queued by read_param_range() and
// issued by flush(), merging neighbours: loading a shard saved with the same layout becomes
// one large read per tensor.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, Manifest manifest);

  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  std::string file_path(std::size_t file) const;

  // Error(io) naming the file when it is missing, Error(corrupt) when its size differs from
  // the manifest's (a stat: cheap enough for every rank to check every file).
  void check_present(std::size_t file) const;
  // Opens file `file`, checks its size, parses its header (read_safetensors_header) and checks
  // that it holds exactly what the manifest promises: the metadata of this save and index, and
  // the tensors "params" and every state kind of [shard_numel] elements, plus "frozen_params"
  // in file 0 when there are frozen parameters, and nothing else. Done once per file. When the
  // header fails and the file's CRC32C differs too, the error is the CRC's (naming both).
  void check_header(std::size_t file);
  // Error(corrupt) naming the file when its CRC32C differs from the manifest's.
  void verify_checksum(std::size_t file);

  bool has_tensor(const std::string& tensor) const;  // "params" or a saved state kind
  // Queues elements [offset, offset + length) of parameter `param` of `tensor` into `out`.
  // A moment kind of a parameter with 8-bit moments is not there (Error(internal)).
  void read_param_range(const std::string& tensor, int32_t param, int64_t offset, int64_t length, float* out);
  // Queues the 8-bit moment `m` (0: exp_avg, 1: exp_avg_sq) of parameter `param` (one that
  // keeps them, ManifestParam::q8): its numel codes and q8_blocks(numel) absmax values.
  void read_q8(int32_t param, std::size_t m, uint8_t* codes, float* absmax);
  // Queues the whole of frozen parameter `param` into `out`.
  void read_frozen(int32_t param, float* out);
  // Queues elements [offset, offset + length) of frozen parameter `param` into `out`.
  void read_frozen_range(int32_t param, int64_t offset, int64_t length, float* out);
  void flush();

 private:
  struct Piece {
    std::size_t file;
    const partition::Segment* segment;
    optim::MomentPlace place;  // where the file keeps the segment's moments
  };
  struct Request {
    std::size_t file;
    int64_t file_offset;
    char* out;
    std::size_t bytes;
  };
  int64_t tensor_start(std::size_t file, const std::string& tensor);
  InputFile& input(std::size_t file);
  SafetensorsHeader parse_header(std::size_t file);
  std::string checksum_mismatch(std::size_t file);  // empty when the CRC32C matches
  void enqueue(std::size_t file, int64_t file_offset, void* out, std::size_t bytes);

  std::string dir_;
  Manifest manifest_;
  std::vector<std::vector<Piece>> pieces_;  // per param, by param_offset
  std::vector<int64_t> frozen_offset_;      // per param: element offset in "frozen_params"
  std::vector<FileMoments> moments_;        // per file
  std::vector<std::unique_ptr<InputFile>> files_;
  std::vector<std::optional<SafetensorsHeader>> headers_;
  std::vector<Request> queue_;
};

// Writes one shard file atomically: the header at construction, then the tensors' elements
// in the order of `tensors`, then commit().
class ShardFileWriter {
 public:
  ShardFileWriter(const std::string& path, std::vector<TensorEntry> tensors,
                  const std::map<std::string, std::string>& metadata);
  void write(const float* data, int64_t count);
  void write_zeros(int64_t count);
  void write_bytes(const void* data, int64_t bytes);  // a U8 tensor's elements
  // Checks that every promised element was written; returns the file's size and CRC32C.
  ManifestFile commit();

 private:
  AtomicFileWriter file_;
  int64_t expected_bytes_ = 0;
};

// The tensors of shard file `index` of `count`, in the order they are written: "params", the
// state kinds, (file 0 only, when there are frozen params) "frozen_params", and for a file
// holding 8-bit moments the two absmax tensors, then the two code tensors.
std::vector<TensorEntry> shard_tensors(int64_t shard_numel, const std::vector<std::string>& state_kinds,
                                       int64_t frozen_numel, int index, const FileMoments& moments);
// `format`: the file's shard format (FileMoments::format).
std::map<std::string, std::string> shard_metadata(const std::string& save_id, int index, int count,
                                                  int format = kShardFormatVersion);

// The identity of the next save into `dir`: generation one past the current manifest's
// (1 when there is none or it is unreadable) and a random token, so a new save never reuses
// a file name that the previous manifest may point to.
std::pair<uint64_t, std::string> next_save_identity(const std::string& dir);

// The last step of a save, once its shard files are proven: fsyncs the directory (so the shard
// renames are durable), writes manifest.json through a temporary name, renames it into place,
// fsyncs the directory again, then reads it back: the bytes must be those written and parse.
void commit_manifest(const std::string& dir, const Manifest& manifest);
// After commit_manifest: removes shard files and temporaries that `manifest` does not name
// (older saves, crashed saves). Best effort: a failure here never fails the save.
void remove_unreferenced_files(const std::string& dir, const Manifest& manifest);

// Test hooks, read from the environment. Crash safety: true when SHARDOPT_TEST_ABORT_SAVE_AFTER
// equals `point`. A shard damaged after it was written (so the save's proof must catch it):
// true when SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK equals `rank`.
bool test_abort_requested(const char* point);
bool test_damage_requested(int rank);

}  // namespace checkpoint
}  // namespace shardopt
