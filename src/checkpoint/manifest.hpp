// src/checkpoint/manifest.hpp — manifest.json: what a sharded checkpoint holds and where each piece lives.
//
// A checkpoint directory holds one manifest and the shard files it names. Shard file i holds,
// as 1-D F32 safetensors tensors of files[i].shard_numel elements, "params" (the parameter
// values of that shard) and one tensor per entry of state_kinds; files[0] also holds
// "frozen_params": the frozen parameters concatenated in registration order. files[i].segments
// say which parameter pieces sit where in the shard, exactly as partition::Segment does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partition/partition.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace checkpoint {

constexpr int kFormatVersion = 1;
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kParamsTensor = "params";
constexpr const char* kFrozenTensor = "frozen_params";

struct ManifestParam {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::f32;
  int32_t group = 0;
  bool trainable = true;
  int64_t step = 0;
  bool has_momentum_buffer = false;
};

struct ManifestFile {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  uint32_t crc32c = 0;  // of the whole file
  int64_t shard_numel = 0;
  std::vector<partition::Segment> segments;
};

struct Manifest {
  int format_version = kFormatVersion;
  uint64_t generation = 0;  // increases with every save into the same directory
  std::string save_id;      // part of every shard file name of this save
  int world_size = 1;
  partition::Strategy partition = partition::Strategy::flat;
  int64_t alignment = 1;
  Algorithm algorithm = Algorithm::adam;
  std::vector<std::string> state_kinds;
  std::vector<Hyperparams> groups;
  std::vector<ManifestParam> params;
  std::vector<ManifestFile> files;
  // Loss scaling's state (GradScaler's scale and growth count) when the optimizer had it on.
  bool has_loss_scale = false;
  double loss_scale = 1.0;
  int64_t growth_tracker = 0;

  int64_t frozen_numel() const;
  int64_t total_file_bytes() const;
};

const char* strategy_name(partition::Strategy strategy);
std::string manifest_to_json(const Manifest& manifest);
// Parses and checks `text` (read from `path`, named in errors): a newer format version is
// Error(unsupported); anything malformed or inconsistent (segments that do not tile every
// trainable parameter exactly once, indices out of range) is Error(corrupt).
Manifest parse_manifest(const std::string& text, const std::string& path);
// Error(io) naming the path when the directory has no manifest.
Manifest read_manifest(const std::string& dir);
// For the consolidated export's metadata: the params (name, numel, dtype, group, trainable,
// step, has_momentum_buffer) and the groups (hyperparameters, param indices) as compact JSON,
// free of anything that depends on the world size or the save.
std::string params_summary_json(const Manifest& manifest);
std::string groups_summary_json(const Manifest& manifest);
// The shard file name of `index` of `count` for a save.
std::string shard_file_name(const std::string& save_id, int index, int count);
// Whether `name` looks like a file a save wrote (a shard, or a temporary of a shard/manifest).
bool is_checkpoint_file_name(const std::string& name);

}  // namespace checkpoint
}  // namespace shardopt
