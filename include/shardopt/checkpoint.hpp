// shardopt/checkpoint.hpp — torch-style state dicts and the offline tools over sharded checkpoint directories.
//
// The collective entry points (save/load, consolidate_state_dict/state_dict/load_state_dict)
// are members of ZeroOptimizer (optimizer.hpp). The functions here read and write checkpoint
// directories without a communicator: the shardopt-ckpt tool and scripts use them.
#pragma once

#include <cstdint>
#include <map>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardopt/export.hpp"
#include "shardopt/optimizer.hpp"

namespace shardopt {

// torch.optim's per-parameter state: "step" plus the tensors its group's algorithm keeps
// ("exp_avg", "exp_avg_sq", "max_exp_avg_sq" for Adam/AdamW, "momentum_buffer" for SGD and
// Muon), each as many fp32 elements as the parameter.
// An 8-bit moment (state_precision = q8) as torchao's OptimState8bit holds it: `codes`, one
// byte per element of the parameter, index into the dynamic map (signed for "exp_avg",
// unsigned for "exp_avg_sq": q8_map()), and `scale`, the absmax of each block of 256 elements
// (bitsandbytes' blocks: the last may be partial). Element e is map[codes[e]] * scale[e / 256].
struct Q8State {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
};

struct ParamState {
  int64_t step = 0;
  std::map<std::string, std::vector<float>> tensors;
  // Params with 8-bit moments: "exp_avg" and "exp_avg_sq" are here instead of in `tensors`.
  std::map<std::string, Q8State> q8;
};

// The 256 entries of bitsandbytes' dynamic quantisation map that 8-bit moments index:
// signed (exp_avg) or unsigned (exp_avg_sq), torchao's OptimState8bit `qmap`.
SHARDOPT_API std::vector<float> q8_map(bool is_signed);

struct ParamGroupState {
  Hyperparams hyper;
  // The group's settings (its algorithm always set in a dict shardopt makes; unset: the dict's
  // algorithm).
  GroupSettings settings{};
  std::vector<ParamId> params;  // global indices, registration order
};

// The whole optimizer's state, as torch's optimizer.state_dict(): state keyed by global param
// index (params without state, frozen or never stepped, are absent), and the groups.
struct StateDict {
  Algorithm algorithm = Algorithm::adam;  // the optimizer's (config.algorithm); groups say their own
  std::vector<std::string> param_names;  // by global index: checked on load
  std::map<ParamId, ParamState> state;
  std::vector<ParamGroupState> param_groups;
};

// ---- sharded checkpoint directories, offline ------------------------------------------------

struct CheckpointInfo {
  int format_version = 0;
  std::string save_id;
  int world_size = 0;
  std::string partition;  // "flat", "sorted_greedy" or "replicated"
  Algorithm algorithm = Algorithm::adam;
  int num_groups = 0;
  int num_params = 0;
  int64_t numel = 0;            // all parameters
  int64_t trainable_numel = 0;
  std::vector<std::string> state_kinds;
  int64_t min_step = 0;  // over trainable params
  int64_t max_step = 0;
  int num_files = 0;
  int64_t file_bytes = 0;  // shard files, manifest excluded
};

// Every offline function below checks the checkpoint as a load does, by the same code: the
// manifest's own checksum, format version and consistency (hyperparameters, state kinds,
// segments, file names), and every shard file's presence, size, header (exactly the tensors
// and metadata the manifest promises, laid out as the safetensors reference reader requires)
// and CRC32C. The first problem raises Error(io/corrupt/unsupported) naming the file and field.

// The summary of a checkpoint, after the full check above. Error(io) if there is none.
SHARDOPT_API CheckpointInfo read_checkpoint_info(const std::string& dir);

// Called as long offline operations advance: what is being done, and how far (done of total,
// in bytes read). shardopt-ckpt draws a progress bar from it when stderr is a terminal.
using CheckpointProgress = std::function<void(const char* stage, int64_t done, int64_t total)>;

// The full check above and nothing else: what verifies loads, and what loads verifies.
SHARDOPT_API void verify_checkpoint(const std::string& dir,
                       const CheckpointProgress& progress = {});

// Manifests of format version 1 carry no checksum of their own and are refused by everything
// above. This checks every shard file against such a manifest (size, header, CRC32C) and the
// manifest's consistency, then rewrites it, atomically, in the current version. Returns
// whether it rewrote anything (false: the checkpoint was current and verifies).
SHARDOPT_API bool upgrade_checkpoint(const std::string& dir, const CheckpointProgress& progress = {});

// Writes one safetensors file with every parameter ("param.<name>") and its optimizer state
// ("state.<name>.<kind>") in global parameter order, steps and groups in the metadata. The
// bytes depend only on the saved training state, not on the world size or partition that
// wrote the checkpoint. Verifies the checkpoint first; the output is written atomically.
SHARDOPT_API void export_checkpoint(const std::string& dir, const std::string& out_file,
                       const CheckpointProgress& progress = {});

struct ReshardOptions {
  int world_size = 1;
  // Partition of the new shards; default: the checkpoint's (flat for a replicated one).
  std::optional<PartitionStrategy> partition;
};
// Rewrites the checkpoint in `dir` as one saved by `options.world_size` ranks into `out_dir`
// (created if needed; may equal `dir`), with the same atomic protocol as a save.
SHARDOPT_API void reshard_checkpoint(const std::string& dir, const std::string& out_dir, const ReshardOptions& options,
                        const CheckpointProgress& progress = {});

}  // namespace shardopt
