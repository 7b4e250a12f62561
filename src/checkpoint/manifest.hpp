// src/checkpoint/manifest.hpp — manifest.json: what a sharded checkpoint holds and where each piece lives.
//
// A checkpoint directory holds one manifest and the shard files it names. Shard file i holds,
// as 1-D F32 safetensors tensors of files[i].shard_numel elements, "params" (the parameter
// values of that shard) and one tensor per entry of state_kinds; files[0] also holds
// "frozen_params": the frozen parameters concatenated in registration order. files[i].segments
// say which parameter pieces sit where in the shard, exactly as partition::Segment does.
//
// Format version 2 protects the manifest itself: its last member, "manifest_crc32c", holds the
// CRC32C (8 hex digits) of every byte of the file before those digits, and the file ends right
// after them ("\"\n}\n"). Any changed, added or removed byte is refused; the file stays plain
// JSON for other readers. Version 1 manifests had no such checksum: they are refused, and
// `shardopt-ckpt upgrade` rewrites them after checking every shard file against them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "partition/partition.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {
namespace checkpoint {

constexpr int kFormatVersion = 2;
// The shard files' own layout (and the consolidated export's) did not change with version 2.
// Shard format 2: a file holding 8-bit moments (ManifestParam::q8) keeps them as U8 codes and
// F32 absmax tensors, and its f32 moment kinds over its other params only (store.hpp).
// Files without 8-bit moments stay format 1, byte for byte.
// Shard format 3: the moment kinds placed by algorithm (Manifest::moments_by_algorithm, store.hpp).
constexpr int kShardFormatVersion = 1;
constexpr int kShardFormatVersionQ8 = 2;
constexpr int kShardFormatVersionByAlgorithm = 3;
constexpr const char* kManifestName = "manifest.json";
// Far above any real job; bounds the number of shard files a manifest may list. The most ranks
// and the largest alignment a layout takes (partition.hpp), so that whatever is saved loads.
constexpr int kMaxWorldSize = partition::kMaxWorld;
constexpr int64_t kMaxAlignment = partition::kMaxAlignment;
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
  std::vector<int64_t> shape{};  // as registered; empty: 1-D (written only when set)
  // Trainable params of state_precision = q8 groups at or above min_8bit_size: exp_avg and
  // exp_avg_sq are 8-bit codes and absmax per block in the shard file (shard format 2);
  // written as "state_precision": "q8" only when set.
  bool q8 = false;
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
  // Each group's algorithm (a group's "algorithm" key, written where it differs from the
  // optimizer's `algorithm`; Muon's own hyperparameters are written for Muon groups only).
  std::vector<Algorithm> group_algorithms;
  // The shard files keep each moment kind only over the params whose algorithm keeps it (shard
  // format 3): "moment_placement": "by_algorithm", written when set. Unset: every moment kind
  // over every param (formats 1 and 2), as saves made before it existed.
  bool moments_by_algorithm = false;
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
// Per param: whether it keeps 8-bit moments (ManifestParam::q8).
std::vector<bool> q8_params(const Manifest& manifest);
bool any_q8(const Manifest& manifest);
// Group g's algorithm (the manifest's own where group_algorithms does not say).
Algorithm group_algorithm(const Manifest& manifest, std::size_t g);
// The partition's view of the saved parameters (optim::layout_info of each).
std::vector<partition::ParamInfo> layout_infos(const Manifest& manifest);
// The manifest's text in the current format version, its checksum last.
std::string manifest_to_json(const Manifest& manifest);
// Parses and checks `text` (read from `path`, named in errors): the checksum first (any change
// is Error(corrupt)), then the format version (a newer one, or version 1, is
// Error(unsupported)), every field's type and range, and check_manifest(). With
// `accept_version_1` (the upgrade only), a version-1 manifest without a checksum is read too.
Manifest parse_manifest(const std::string& text, const std::string& path, bool accept_version_1 = false);
// Error(io) naming the path when the directory has no manifest.
Manifest read_manifest(const std::string& dir, bool accept_version_1 = false);
// manifest_check.cpp: everything a manifest must satisfy on its own, so that a load can trust
// it: sizes within kMaxElements, one dtype, hyperparameters a step accepts, state kinds that
// the algorithm has and its groups need (in canonical order), shard files named as this save
// names them, segments inside their parameter and shard, disjoint within a shard and tiling
// every trainable parameter exactly once. Error(corrupt) naming `path` and the field.
void check_manifest(const Manifest& manifest, const std::string& path);
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
