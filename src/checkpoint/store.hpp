// src/checkpoint/store.hpp — reading parameter pieces out of a checkpoint and writing shard files and manifests.
//
// Shared by ZeroOptimizer::save/load (sharded_checkpoint.cpp) and the offline tools
// (offline.cpp), so both read and write exactly the same format.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/safetensors.hpp"

namespace shardopt {
namespace checkpoint {

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
  void read_param_range(const std::string& tensor, int32_t param, int64_t offset, int64_t length, float* out);
  // Queues the whole of frozen parameter `param` into `out`.
  void read_frozen(int32_t param, float* out);
  // Queues elements [offset, offset + length) of frozen parameter `param` into `out`.
  void read_frozen_range(int32_t param, int64_t offset, int64_t length, float* out);
  void flush();

 private:
  struct Piece {
    std::size_t file;
    const partition::Segment* segment;
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
  // Checks that every promised element was written; returns the file's size and CRC32C.
  ManifestFile commit();

 private:
  AtomicFileWriter file_;
  int64_t expected_bytes_ = 0;
};

// The tensors of shard file `index` of `count`, in the order they are written: "params", the
// state kinds, and (file 0 only, when there are frozen params) "frozen_params".
std::vector<TensorEntry> shard_tensors(int64_t shard_numel, const std::vector<std::string>& state_kinds,
                                       int64_t frozen_numel, int index);
std::map<std::string, std::string> shard_metadata(const std::string& save_id, int index, int count);

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
