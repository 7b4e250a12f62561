// src/checkpoint/state_dict.cpp — torch-style consolidate_state_dict / state_dict / load_state_dict over the optimizer's parts.
#include <algorithm>
#include <cstring>
#include <memory>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/staging.hpp"
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

// Each group's algorithm as the dict says (a group without one runs the dict's algorithm).
std::vector<Algorithm> algorithms_of(const StateDict& dict) {
  std::vector<Algorithm> algorithms;
  for (const ParamGroupState& g : dict.param_groups) algorithms.push_back(g.settings.algorithm.value_or(dict.algorithm));
  return algorithms;
}

}  // namespace

std::vector<ParamGroupState> current_groups(const optim::ParamTable& table) {
  std::vector<ParamGroupState> groups(table.groups().size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    groups[g].hyper = table.groups()[g];
    groups[g].settings.algorithm = table.algorithms()[g];
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    groups[static_cast<std::size_t>(table.params()[i].group)].params.push_back(static_cast<ParamId>(i));
  }
  return groups;
}

// Consolidation is torch's object broadcast (_broadcast_object: a length, then the bytes),
// bounded: rank r's state over its shard, kind after kind, is its serialised object; it
// broadcasts the length, then the bytes in chunks of one staging slot, staged out of device
// memory by its copy engine (chunk k+1 copied while chunk k is broadcast) and sent over the
// host communicator (which stages through a device buffer of one chunk when the communicator
// takes device memory only). The target scatters each chunk into the dict as it arrives, so
// its peak is its own state + two slots + the consolidated dict; no rank ever holds another
// rank's whole shard.
std::optional<StateDict> gather_state_dict(const OptimizerParts& parts, int to) {
  const optim::DeviceContext& dev = parts.dev;
  const optim::ShardState& shard = parts.shard;
  const std::vector<optim::ParamRecord>& params = parts.table.params();
  const bool target = dev.rank() == to;
  const optim::StateMask kinds = shard.state_kinds_needed();
  std::vector<std::size_t> kind_list;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (kinds[k]) kind_list.push_back(k);
  }
  StateDict dict;
  if (target) {
    dict.algorithm = parts.config.algorithm;
    for (const optim::ParamRecord& p : params) dict.param_names.push_back(p.name);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const optim::ParamRecord& p = params[i];
      if (!has_state(p)) continue;
      ParamState& s = dict.state[static_cast<ParamId>(i)];
      s.step = p.step;
      const Algorithm algorithm = parts.table.algorithm(p.group);
      for (std::size_t k : kind_list) {
        if (!optim::kind_belongs(algorithm, k)) continue;  // another group's kind
        if (k == optim::kMomentum && !p.has_momentum_buffer) continue;
        s.tensors[optim::kStateNames[k]].assign(static_cast<std::size_t>(p.numel), 0.f);
      }
    }
  }
  // Shard elements [first, first + count) of state kind k, from `from`, into the dict.
  auto scatter = [&](const partition::RankShard& from, std::size_t k, int64_t first, int64_t count,
                     const float* values) {
    const int64_t end = first + count;
    for (const partition::Segment& seg : from.segments) {
      const int64_t lo = std::max(first, seg.shard_offset);
      const int64_t hi = std::min(end, seg.shard_offset + seg.length);
      if (lo >= hi) continue;
      auto entry = dict.state.find(seg.param);
      if (entry == dict.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(tensor->second.data() + seg.param_offset + (lo - seg.shard_offset), values + (lo - first),
                  static_cast<std::size_t>(hi - lo) * sizeof(float));
    }
  };
  // Rank r's object: each kind's array over its shard (zeros for a kind not allocated yet).
  auto object_of = [&](int r) {
    const partition::RankShard& from = shard.layout().shards[static_cast<std::size_t>(r)];
    std::vector<StagedRegion> regions;
    for (std::size_t k : kind_list) {
      const core::FlatBuffer& mine = shard.state()[k];
      const bool held = r == dev.rank() && mine.numel() == from.numel && from.numel > 0;
      regions.push_back(StagedRegion{held ? mine.data() : nullptr, DType::f32, from.numel});
    }
    return regions;
  };
  auto scatter_chunk = [&](const partition::RankShard& from, const StagedChunk& chunk) {
    for (const StagedPiece& p : chunk.pieces) {
      scatter(from, kind_list[p.region], p.first, p.count, reinterpret_cast<const float*>(p.host));
    }
  };
  // Every rank needs its engine (senders stage out, receivers receive into a slot): a rank
  // without one fails the call on every rank before any broadcast.
  std::unique_ptr<CopyEngine> engine;
  Outcome ready;
  try {
    engine = chunking_engine(dev, parts.staging);
  } catch (const Error& e) {
    ready.fail(e);
  }
  agree_on_outcomes(dev.host_comm(), ready, "consolidate_state_dict", "consolidate_state_dict");
  if (!shard.sharded()) {
    // Every rank holds the whole state: the target reads its own.
    if (target) {
      stage_out(*engine, object_of(dev.rank()),
                [&](const StagedChunk& chunk) { scatter_chunk(shard.own_shard(), chunk); });
    }
    return target ? std::optional<StateDict>(std::move(dict)) : std::nullopt;
  }
  Communicator& comm = dev.host_comm();
  for (int r = 0; r < dev.world(); ++r) {
    const partition::RankShard& from = shard.layout().shards[static_cast<std::size_t>(r)];
    const std::vector<StagedRegion> regions = object_of(r);
    if (r == to) {
      // The target's own object never leaves it.
      if (target) stage_out(*engine, regions, [&](const StagedChunk& chunk) { scatter_chunk(from, chunk); });
      continue;
    }
    uint64_t expected = 0;
    for (const StagedRegion& region : regions) expected += static_cast<uint64_t>(region.count) * sizeof(float);
    uint64_t length = expected;
    comm::broadcast_record(comm, length, r);  // not from the stack: a timed-out broadcast may write it later
    SHARDOPT_CHECK(length == expected, internal,
                   "consolidate_state_dict: rank {} sent {} bytes of state, its shard in this rank's layout holds {}",
                   r, length, expected);
    if (r == dev.rank()) {
      stage_out(*engine, regions, [&](const StagedChunk& chunk) {
        comm::broadcast_bytes(comm, chunk.host, static_cast<int64_t>(chunk.bytes), r);
      });
      continue;
    }
    // The same chunks as the sender's (the same plan), received into one slot.
    ChunkPlanner plan(regions, engine->slot_bytes());
    StagedChunk chunk;
    while (plan.next(engine->slot(0), chunk)) {
      comm::broadcast_bytes(comm, chunk.host, static_cast<int64_t>(chunk.bytes), r);
      if (target) scatter_chunk(from, chunk);
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
    const Algorithm saved = sd.param_groups[g].settings.algorithm.value_or(sd.algorithm);
    const Algorithm here = parts.table.algorithm(static_cast<int>(g));
    SHARDOPT_CHECK(saved == here, mismatch, "load_state_dict: param group {} runs {} in the state dict but {} here", g,
                   algorithm_name(saved), algorithm_name(here));
    optim::validate_hyperparams(sd.param_groups[g].hyper, here, static_cast<int>(g));
  }
  const optim::StateMask kinds = optim::state_kinds_needed(algorithms_of(sd), parts.table.dtype(), hypers_of(sd));
  for (const auto& [id, s] : sd.state) {
    SHARDOPT_CHECK(id >= 0 && static_cast<std::size_t>(id) < params.size(), invalid_argument,
                   "load_state_dict: state for parameter #{} which does not exist", id);
    const optim::ParamRecord& p = params[static_cast<std::size_t>(id)];
    SHARDOPT_CHECK(p.trainable, invalid_argument, "load_state_dict: state for frozen parameter '{}'", p.name);
    SHARDOPT_CHECK(s.step >= 0, invalid_argument, "load_state_dict: parameter '{}' has negative step {}", p.name, s.step);
    for (const auto& [kind, values] : s.tensors) {
      const std::size_t k = kind_index(kind);
      const Algorithm group_algorithm = parts.table.algorithm(p.group);
      SHARDOPT_CHECK(k < optim::kStateKinds && kinds[k] && optim::kind_belongs(group_algorithm, k), invalid_argument,
                     "load_state_dict: parameter '{}' has state '{}', which a {} group does not keep", p.name, kind,
                     algorithm_name(group_algorithm));
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
  const optim::StateMask kinds = optim::state_kinds_needed(algorithms_of(sd), table.dtype(), hypers_of(sd));
  const partition::RankShard& shard = parts.shard.own_shard();
  // Shard elements [first, first + count) of kind k as the dict has them (zeros elsewhere).
  auto fill = [&](std::size_t k, int64_t first, int64_t count, float* out) {
    std::fill(out, out + count, 0.f);
    const int64_t end = first + count;
    for (const partition::Segment& seg : shard.segments) {
      const int64_t lo = std::max(first, seg.shard_offset);
      const int64_t hi = std::min(end, seg.shard_offset + seg.length);
      if (lo >= hi) continue;
      auto entry = sd.state.find(seg.param);
      if (entry == sd.state.end()) continue;
      auto tensor = entry->second.tensors.find(optim::kStateNames[k]);
      if (tensor == entry->second.tensors.end()) continue;
      std::memcpy(out + (lo - first), tensor->second.data() + seg.param_offset + (lo - seg.shard_offset),
                  static_cast<std::size_t>(hi - lo) * sizeof(float));
    }
  };
  optim::StateBuffers buffers;
  std::vector<StagedRegion> regions;
  std::vector<std::size_t> region_kind;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    buffers[k] = parts.dev.new_buffer(kinds[k] ? shard.numel : 0);
    if (!kinds[k] || shard.numel == 0) continue;
    regions.push_back(StagedRegion{buffers[k].data(), DType::f32, shard.numel});
    region_kind.push_back(k);
  }
  // Made after the buffers, so that its copies follow their zero fill on a device.
  if (const std::unique_ptr<CopyEngine> engine = staging_engine(parts.dev, parts.staging)) {
    stage_in(*engine, regions, [&](const StagedChunk& chunk) {
      for (const StagedPiece& p : chunk.pieces) {
        fill(region_kind[p.region], p.first, p.count, reinterpret_cast<float*>(p.host));
      }
    });
  } else {
    for (std::size_t r = 0; r < regions.size(); ++r) {
      fill(region_kind[r], 0, shard.numel, static_cast<float*>(regions[r].data));
    }
  }
  parts.shard.install_state(kinds, std::move(buffers), without_master);
}

}  // namespace checkpoint
}  // namespace shardopt
