// src/checkpoint/state_dict.cpp — torch-style consolidate_state_dict / state_dict / load_state_dict over the optimizer's parts.
#include <algorithm>
#include <cstring>
#include <memory>
#include <type_traits>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/staging.hpp"
#include "comm/raw_collectives.hpp"
#include "core/check.hpp"
#include "optim/hyperparams.hpp"
#include "q8_maps.hpp"
#include "q8_state.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// torch keeps state only for params that have been stepped.
bool has_state(const optim::ParamRecord& p) { return p.trainable && p.step > 0; }

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

// One buffer of a shard's state as consolidation moves it: a state kind (f32), or an 8-bit
// moment's absmax (f32) or codes (bytes).
enum class Part { kind, absmax, codes };
struct StateRegion {
  Part part;
  std::size_t index;  // the state kind, or the moment (0: exp_avg, 1: exp_avg_sq)
};
const char* q8_name(std::size_t m) { return optim::kStateNames[m == 0 ? optim::kExpAvg : optim::kExpAvgSq]; }
std::size_t element_bytes(Part part) { return part == Part::codes ? 1 : sizeof(float); }

// A run of a region's elements: `length` elements from `at` in the region are elements from
// `param_offset` of param `param`'s tensor (values, scale or codes).
struct Placed {
  int32_t param;
  int64_t param_offset;
  int64_t length;
  int64_t at;
};

// Where each element of `region` over `shard` (its moments placed as `moments`) belongs: each
// kind where place_moments() puts it (the master by shard offset), the 8-bit
// moments' blocks and codes packed over the 8-bit segments (which hold whole params).
std::vector<Placed> placements(const partition::RankShard& shard, const optim::MomentLayout& moments,
                               StateRegion region) {
  std::vector<Placed> out;
  for (std::size_t i = 0; i < shard.segments.size(); ++i) {
    const partition::Segment& s = shard.segments[i];
    const optim::MomentPlace& place = moments.places[i];
    if (s.length == 0) continue;
    if (region.part == Part::kind) {
      if (place.offset[region.index] >= 0) out.push_back(Placed{s.param, s.param_offset, s.length, place.offset[region.index]});
    } else if (place.q8) {
      const bool codes = region.part == Part::codes;
      out.push_back(Placed{s.param, 0, codes ? s.length : kernels::q8_blocks(s.length),
                           codes ? place.code_offset : place.block_offset});
    }
  }
  return out;
}

int64_t region_count(const optim::MomentLayout& moments, StateRegion region) {
  if (region.part == Part::codes) return moments.code_numel;
  if (region.part == Part::absmax) return moments.blocks;
  return moments.numel[region.index];
}

// The regions of a shard's state: each kind, then (where the shard has 8-bit moments) both
// absmax buffers and both code buffers.
std::vector<StateRegion> regions_of(const std::vector<std::size_t>& kind_list, const optim::MomentLayout& moments) {
  std::vector<StateRegion> out;
  for (std::size_t k : kind_list) out.push_back(StateRegion{Part::kind, k});
  if (moments.code_numel > 0) {
    for (std::size_t m = 0; m < 2; ++m) out.push_back(StateRegion{Part::absmax, m});
    for (std::size_t m = 0; m < 2; ++m) out.push_back(StateRegion{Part::codes, m});
  }
  return out;
}

// The bytes of `region`'s tensor in a param's state (null where the state holds no such tensor).
template <typename State>
auto region_data(State& ps, StateRegion region) {
  using Byte = std::conditional_t<std::is_const<State>::value, const char, char>;
  if (region.part == Part::kind) {
    auto it = ps.tensors.find(optim::kStateNames[region.index]);
    return it == ps.tensors.end() ? static_cast<Byte*>(nullptr) : reinterpret_cast<Byte*>(it->second.data());
  }
  auto it = ps.q8.find(q8_name(region.index));
  if (it == ps.q8.end()) return static_cast<Byte*>(nullptr);
  return region.part == Part::codes ? reinterpret_cast<Byte*>(it->second.codes.data())
                                    : reinterpret_cast<Byte*>(it->second.scale.data());
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
      const bool q8 = parts.table.q8_moments(p);
      for (std::size_t k : kind_list) {
        if (!optim::kind_belongs(algorithm, k)) continue;  // another group's kind
        if (k == optim::kMomentum && !p.has_momentum_buffer) continue;
        if (q8 && (k == optim::kExpAvg || k == optim::kExpAvgSq)) continue;  // 8-bit below
        s.tensors[optim::kStateNames[k]].assign(static_cast<std::size_t>(p.numel), 0.f);
      }
      if (!q8) continue;
      for (std::size_t m = 0; m < 2; ++m) {
        Q8State& q = s.q8[q8_name(m)];
        q.codes.assign(static_cast<std::size_t>(p.numel), 0);
        q.scale.assign(static_cast<std::size_t>(kernels::q8_blocks(p.numel)), 0.f);
      }
    }
  }
  // Each rank's shard, its moments placed as that rank places them.
  std::vector<optim::MomentLayout> moments;
  for (const partition::RankShard& from : shard.layout().shards) moments.push_back(shard.place_moments(from));
  // Rank r's object: each region over its shard (zeros for a kind not allocated yet).
  auto object_of = [&](int r) {
    const auto rank = static_cast<std::size_t>(r);
    std::vector<StagedRegion> regions;
    for (const StateRegion& region : regions_of(kind_list, moments[rank])) {
      const int64_t count = region_count(moments[rank], region);
      const core::FlatBuffer& mine = region.part == Part::kind     ? shard.state()[region.index]
                                     : region.part == Part::absmax ? shard.q8_absmax(region.index)
                                                                   : shard.q8_codes(region.index);
      const bool held = r == dev.rank() && mine.numel() == count && count > 0;
      regions.push_back(StagedRegion{held ? const_cast<void*>(mine.raw()) : nullptr,
                                     region.part == Part::codes ? DType::byte : DType::f32, count});
    }
    return regions;
  };
  // Region elements [first, first + count) of rank r's object into the dict.
  auto scatter = [&](int r, StateRegion region, int64_t first, int64_t count, const char* values) {
    const auto rank = static_cast<std::size_t>(r);
    const int64_t end = first + count;
    const std::size_t bytes = element_bytes(region.part);
    for (const Placed& p : placements(shard.layout().shards[rank], moments[rank], region)) {
      const int64_t lo = std::max(first, p.at);
      const int64_t hi = std::min(end, p.at + p.length);
      if (lo >= hi) continue;
      auto entry = dict.state.find(p.param);
      if (entry == dict.state.end()) continue;
      char* dest = region_data(entry->second, region);
      if (dest == nullptr) continue;
      std::memcpy(dest + static_cast<std::size_t>(p.param_offset + (lo - p.at)) * bytes,
                  values + static_cast<std::size_t>(lo - first) * bytes, static_cast<std::size_t>(hi - lo) * bytes);
    }
  };
  auto scatter_chunk = [&](int r, const StagedChunk& chunk) {
    const std::vector<StateRegion> regions = regions_of(kind_list, moments[static_cast<std::size_t>(r)]);
    for (const StagedPiece& p : chunk.pieces) {
      scatter(r, regions[p.region], p.first, p.count, static_cast<const char*>(p.host));
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
      stage_out(*engine, object_of(dev.rank()), [&](const StagedChunk& chunk) { scatter_chunk(dev.rank(), chunk); });
    }
    return target ? std::optional<StateDict>(std::move(dict)) : std::nullopt;
  }
  Communicator& comm = dev.host_comm();
  for (int r = 0; r < dev.world(); ++r) {
    const std::vector<StagedRegion> regions = object_of(r);
    if (r == to) {
      // The target's own object never leaves it.
      if (target) stage_out(*engine, regions, [&](const StagedChunk& chunk) { scatter_chunk(r, chunk); });
      continue;
    }
    uint64_t expected = 0;
    for (const StagedRegion& region : regions) {
      expected += static_cast<uint64_t>(region.count) * dtype_size(region.dtype);
    }
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
      if (target) scatter_chunk(r, chunk);
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
    // 8-bit moments load into 8-bit moments only (no requantisation), whole and of this size.
    const bool q8_here = parts.table.q8_moments(p);
    for (const auto& [kind, q] : s.q8) {
      SHARDOPT_CHECK(q8_here, mismatch,
                     "load_state_dict: parameter '{}' has 8-bit '{}' in the state dict (state_precision q8), but its "
                     "group {} keeps fp32 moments here; a state dict loads into the state precision it was taken with",
                     p.name, kind, p.group);
      SHARDOPT_CHECK(kind == q8_name(0) || kind == q8_name(1), invalid_argument,
                     "load_state_dict: parameter '{}' has 8-bit state '{}'; only exp_avg and exp_avg_sq are 8-bit",
                     p.name, kind);
      SHARDOPT_CHECK(static_cast<int64_t>(q.codes.size()) == p.numel &&
                         static_cast<int64_t>(q.scale.size()) == kernels::q8_blocks(p.numel),
                     invalid_argument,
                     "load_state_dict: 8-bit '{}' of parameter '{}' has {} codes and {} scales; the parameter needs {} "
                     "and {} (one absmax per block of {})",
                     kind, p.name, q.codes.size(), q.scale.size(), p.numel, kernels::q8_blocks(p.numel),
                     kernels::kQ8Block);
    }
    for (const auto& [kind, values] : s.tensors) {
      const std::size_t k = optim::state_kind_index(kind);
      SHARDOPT_CHECK(!q8_here || (k != optim::kExpAvg && k != optim::kExpAvgSq), mismatch,
                     "load_state_dict: parameter '{}' keeps 8-bit moments here (state_precision q8), but the state "
                     "dict holds its '{}' as fp32 values; a state dict loads into the state precision it was taken "
                     "with",
                     p.name, kind);
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
    for (const auto& [kind, q] : state.q8) {
      for (unsigned char c : kind) mix(c);
      for (uint8_t c : q.codes) mix(c);
      for (float x : q.scale) {
        uint32_t bits = 0;
        std::memcpy(&bits, &x, sizeof(bits));
        mix(bits);
      }
      mix(q.codes.size());
      mix(q.scale.size());
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
  const optim::MomentLayout moments = parts.shard.place_moments(shard);
  // Region elements [first, first + count) as the dict has them (zeros elsewhere).
  auto fill = [&](StateRegion region, int64_t first, int64_t count, char* out) {
    const std::size_t bytes = element_bytes(region.part);
    std::memset(out, 0, static_cast<std::size_t>(count) * bytes);
    const int64_t end = first + count;
    for (const Placed& p : placements(shard, moments, region)) {
      const int64_t lo = std::max(first, p.at);
      const int64_t hi = std::min(end, p.at + p.length);
      if (lo >= hi) continue;
      auto entry = sd.state.find(p.param);
      if (entry == sd.state.end()) continue;
      const char* from = region_data(entry->second, region);
      if (from == nullptr) continue;
      std::memcpy(out + static_cast<std::size_t>(lo - first) * bytes,
                  from + static_cast<std::size_t>(p.param_offset + (lo - p.at)) * bytes,
                  static_cast<std::size_t>(hi - lo) * bytes);
    }
  };
  std::vector<std::size_t> kind_list;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (kinds[k]) kind_list.push_back(k);
  }
  optim::StateBuffers buffers;
  optim::Q8Buffers q8;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    buffers[k] = parts.dev.new_buffer(kinds[k] ? region_count(moments, StateRegion{Part::kind, k}) : 0);
  }
  for (std::size_t m = 0; m < 2; ++m) {
    q8.codes[m] = parts.dev.new_buffer(moments.code_numel, DType::byte);
    q8.absmax[m] = parts.dev.new_buffer(moments.blocks);
  }
  std::vector<StagedRegion> regions;
  std::vector<StateRegion> region_list;
  for (const StateRegion& region : regions_of(kind_list, moments)) {
    core::FlatBuffer& buffer = region.part == Part::kind     ? buffers[region.index]
                               : region.part == Part::absmax ? q8.absmax[region.index]
                                                             : q8.codes[region.index];
    if (buffer.numel() == 0) continue;
    regions.push_back(StagedRegion{buffer.raw(), region.part == Part::codes ? DType::byte : DType::f32, buffer.numel()});
    region_list.push_back(region);
  }
  // Made after the buffers, so that its copies follow their zero fill on a device.
  if (const std::unique_ptr<CopyEngine> engine = staging_engine(parts.dev, parts.staging)) {
    stage_in(*engine, regions, [&](const StagedChunk& chunk) {
      for (const StagedPiece& p : chunk.pieces) fill(region_list[p.region], p.first, p.count, p.host);
    });
  } else {
    for (std::size_t r = 0; r < regions.size(); ++r) {
      fill(region_list[r], 0, regions[r].count, static_cast<char*>(regions[r].data));
    }
  }
  parts.shard.install_state(kinds, std::move(buffers), without_master, std::move(q8));
}

}  // namespace checkpoint

std::vector<float> q8_map(bool is_signed) {
  const uint32_t* bits = is_signed ? kernels::kQ8SignedMap : kernels::kQ8UnsignedMap;
  std::vector<float> out(256);
  std::memcpy(out.data(), bits, out.size() * sizeof(float));
  return out;
}

}  // namespace shardopt
