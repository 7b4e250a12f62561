// src/checkpoint/state_dict.cpp — torch-style consolidate_state_dict / state_dict / load_state_dict over the optimizer's parts.
#include <cstring>

#include "checkpoint/optimizer_parts.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// torch keeps state only for params that have been stepped.
bool has_state(const optim::ParamRecord& p) { return p.trainable && p.step > 0; }

std::size_t kind_index(const std::string& name) {
  std::size_t k = 0;
  while (k < optim::kStateKinds && name != optim::kStateNames[k]) ++k;
  return k;
}

std::vector<Hyperparams> hypers_of(const StateDict& dict) {
  std::vector<Hyperparams> hypers;
  for (const ParamGroupState& g : dict.param_groups) hypers.push_back(g.hyper);
  return hypers;
}

}  // namespace

std::vector<ParamGroupState> current_groups(const optim::ParamTable& table) {
  std::vector<ParamGroupState> groups(table.groups().size());
  for (std::size_t g = 0; g < groups.size(); ++g) groups[g].hyper = table.groups()[g];
  for (std::size_t i = 0; i < table.size(); ++i) {
    groups[static_cast<std::size_t>(table.params()[i].group)].params.push_back(static_cast<ParamId>(i));
  }
  return groups;
}

std::optional<StateDict> gather_state_dict(const OptimizerParts& parts, int to) {
  const optim::DeviceContext& dev = parts.dev;
  const optim::ShardState& shard = parts.shard;
  const std::vector<optim::ParamRecord>& params = parts.table.params();
  const bool target = dev.rank() == to;
  const optim::StateMask kinds = shard.state_kinds_needed();
  StateDict dict;
  if (target) {
    dict.algorithm = parts.config.algorithm;
    for (const optim::ParamRecord& p : params) dict.param_names.push_back(p.name);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const optim::ParamRecord& p = params[i];
      if (!has_state(p)) continue;
      ParamState& s = dict.state[static_cast<ParamId>(i)];
      s.step = p.step;
      for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
        if (!kinds[k] || (k == optim::kMomentum && !p.has_momentum_buffer)) continue;
        s.tensors[optim::kStateNames[k]].assign(static_cast<std::size_t>(p.numel), 0.f);
      }
    }
  }
  // Copies the pieces of one shard's state array into the dict (target rank only).
  auto scatter = [&](const partition::RankShard& from, std::size_t k, const float* source) {
    for (const partition::Segment& seg : from.segments) {
      auto entry = dict.state.find(seg.param);
      if (seg.length == 0 || entry == dict.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(tensor->second.data() + seg.param_offset, source + seg.shard_offset,
                  static_cast<std::size_t>(seg.length) * sizeof(float));
    }
  };
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!kinds[k]) continue;
    const core::FlatBuffer& mine = shard.state()[k];
    if (!shard.sharded()) {
      if (target && mine.numel() == shard.own_shard().numel) scatter(shard.own_shard(), k, mine.data());
      continue;
    }
    // One broadcast per rank shard; only the target keeps what arrives.
    for (int r = 0; r < dev.world(); ++r) {
      const partition::RankShard& from = shard.layout().shards[static_cast<std::size_t>(r)];
      if (from.numel == 0) continue;
      core::FlatBuffer buffer(from.numel);
      if (r == dev.rank() && mine.numel() == from.numel) {
        std::memcpy(buffer.data(), mine.data(), static_cast<std::size_t>(buffer.bytes()));
      }
      comm::broadcast_in_chunks(dev.comm(), buffer.data(), from.numel, DType::f32, r,
                                optim::bucket_elements(parts.config, DType::f32));
      if (target) scatter(from, k, buffer.data());
    }
  }
  if (!target) return std::nullopt;
  return dict;
}

void check_state_dict(const OptimizerParts& parts, const StateDict& sd) {
  const Algorithm algorithm = parts.config.algorithm;
  const std::vector<optim::ParamRecord>& params = parts.table.params();
  SHARDOPT_CHECK(sd.algorithm == algorithm, mismatch, "load_state_dict: the state dict is of a {} optimizer; this one runs {}",
                 algorithm_name(sd.algorithm), algorithm_name(algorithm));
  SHARDOPT_CHECK(sd.param_names.size() == params.size(), mismatch,
                 "load_state_dict: the state dict names {} parameters, {} are registered", sd.param_names.size(),
                 params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    SHARDOPT_CHECK(sd.param_names[i] == params[i].name, mismatch,
                   "load_state_dict: parameter #{} is '{}' in the state dict but '{}' here", i, sd.param_names[i],
                   params[i].name);
  }
  SHARDOPT_CHECK(static_cast<int>(sd.param_groups.size()) == parts.table.num_groups(), mismatch,
                 "load_state_dict: the state dict has {} param groups, this optimizer {}", sd.param_groups.size(),
                 parts.table.num_groups());
  const std::vector<ParamGroupState> groups_here = current_groups(parts.table);
  for (std::size_t g = 0; g < sd.param_groups.size(); ++g) {
    SHARDOPT_CHECK(sd.param_groups[g].params == groups_here[g].params, mismatch,
                   "load_state_dict: param group {} holds other parameters in the state dict than here", g);
    optim::validate_hyperparams(sd.param_groups[g].hyper, algorithm, static_cast<int>(g));
  }
  const optim::StateMask kinds = optim::state_kinds_needed(algorithm, parts.table.dtype(), hypers_of(sd));
  for (const auto& [id, s] : sd.state) {
    SHARDOPT_CHECK(id >= 0 && static_cast<std::size_t>(id) < params.size(), invalid_argument,
                   "load_state_dict: state for parameter #{} which does not exist", id);
    const optim::ParamRecord& p = params[static_cast<std::size_t>(id)];
    SHARDOPT_CHECK(p.trainable, invalid_argument, "load_state_dict: state for frozen parameter '{}'", p.name);
    SHARDOPT_CHECK(s.step >= 0, invalid_argument, "load_state_dict: parameter '{}' has negative step {}", p.name, s.step);
    for (const auto& [kind, values] : s.tensors) {
      const std::size_t k = kind_index(kind);
      SHARDOPT_CHECK(k < optim::kStateKinds && kinds[k], invalid_argument,
                     "load_state_dict: parameter '{}' has state '{}', which a {} optimizer with these groups does not keep",
                     p.name, kind, algorithm_name(algorithm));
      SHARDOPT_CHECK(static_cast<int64_t>(values.size()) == p.numel, invalid_argument,
                     "load_state_dict: '{}' of parameter '{}' has {} elements, the parameter {}", kind, p.name,
                     values.size(), p.numel);
    }
  }
}

uint64_t content_hash(const StateDict& sd) {
  // Word-wise multiply-xor over every value: fast enough next to reading the dict at all.
  uint64_t h = 0x243f6a8885a308d3ull;
  auto mix = [&h](uint64_t word) { h = (h ^ word) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; };
  for (const auto& [id, state] : sd.state) {
    mix(static_cast<uint64_t>(id));
    mix(static_cast<uint64_t>(state.step));
    for (const auto& [kind, values] : state.tensors) {
      for (unsigned char c : kind) mix(c);
      const std::size_t words = values.size() / 2;
      const auto* data = reinterpret_cast<const unsigned char*>(values.data());
      for (std::size_t w = 0; w < words; ++w) {
        uint64_t word = 0;
        std::memcpy(&word, data + w * sizeof(word), sizeof(word));
        mix(word);
      }
      if (values.size() % 2 != 0) {
        uint32_t last = 0;
        std::memcpy(&last, &values.back(), sizeof(last));
        mix(last);
      }
      mix(values.size());
    }
  }
  return h;
}

void install_state_dict(const OptimizerParts& parts, const StateDict& sd) {
  optim::ParamTable& table = parts.table;
  for (std::size_t g = 0; g < sd.param_groups.size(); ++g) table.group(static_cast<int>(g)) = sd.param_groups[g].hyper;
  std::vector<bool> without_master(table.size(), true);
  for (std::size_t i = 0; i < table.size(); ++i) {
    optim::ParamRecord& p = table.param(static_cast<ParamId>(i));
    auto it = sd.state.find(static_cast<ParamId>(i));
    p.step = it == sd.state.end() ? 0 : it->second.step;
    p.has_momentum_buffer = it != sd.state.end() && it->second.tensors.count("momentum_buffer") > 0;
    without_master[i] = it == sd.state.end() || it->second.tensors.count("master") == 0;
  }
  // State absent from the dict starts afresh (zeros, as torch's lazily created state); a
  // bf16/f16 master absent from it is seeded from the current parameter values.
  const optim::StateMask kinds = optim::state_kinds_needed(parts.config.algorithm, table.dtype(), hypers_of(sd));
  const partition::RankShard& shard = parts.shard.own_shard();
  optim::StateBuffers buffers;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    buffers[k] = parts.dev.new_buffer(kinds[k] ? shard.numel : 0);
    if (!kinds[k]) continue;
    for (const partition::Segment& seg : shard.segments) {
      auto entry = sd.state.find(seg.param);
      if (seg.length == 0 || entry == sd.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(buffers[k].data() + seg.shard_offset, tensor->second.data() + seg.param_offset,
                  static_cast<std::size_t>(seg.length) * sizeof(float));
    }
  }
  parts.shard.install_state(kinds, std::move(buffers), without_master);
}

}  // namespace checkpoint
}  // namespace shardopt
