// src/checkpoint/optimizer_parts.hpp — what checkpoints read and change of an optimizer, and the checkpoint operations over it.
//
// The facade (src/optim/zero_optimizer.cpp) runs each entry point's agreement first, then
// calls these; they reach the optimizer only through these parts' declared interfaces
// (ShardState's state access and install_state, which keep runs and masters consistent).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"
#include "checkpoint/staging.hpp"
#include "optim/device_context.hpp"
#include "optim/param_table.hpp"
#include "optim/shard_state.hpp"
#include "optim/step.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {
namespace checkpoint {

struct OptimizerParts {
  const OptimizerConfig& config;
  const optim::DeviceContext& dev;
  optim::ParamTable& table;
  optim::ShardState& shard;
  optim::Step& step;
  // State on a device (or, in tests, forced) moves through bounded staging (staging.hpp).
  const StagingSettings& staging;
};

std::vector<std::string> state_kind_names(const optim::StateMask& kinds);

// Error(mismatch) naming the first parameter (or group count) where `manifest` differs from
// what is registered (names, numels, shapes, dtypes, groups), or a group's algorithm. `source`
// names the checkpoint in the message.
void check_same_model(const optim::ParamTable& table, const Manifest& manifest, const std::string& source);

// Collective (sharded_checkpoint.cpp). save: shard files, then rank 0's manifest. load:
// validates and reads everything, the ranks agree, then installs; the caller syncs parameters.
void save_checkpoint(const OptimizerParts& parts, const std::string& dir);
void load_checkpoint(const OptimizerParts& parts, const std::string& dir);

// state_dict.cpp. gather: collective, the dict on rank `to` (nullopt elsewhere). check: local,
// throws what makes `dict` unloadable here. install: local, after the ranks agreed.
std::optional<StateDict> gather_state_dict(const OptimizerParts& parts, int to);
void check_state_dict(const OptimizerParts& parts, const StateDict& dict);
void install_state_dict(const OptimizerParts& parts, const StateDict& dict);
// A hash of every step count and state value: ranks loading different dicts would each keep
// their share of another state, so the ranks agree on it first.
uint64_t content_hash(const StateDict& dict);
std::vector<ParamGroupState> current_groups(const optim::ParamTable& table);

}  // namespace checkpoint
}  // namespace shardopt
