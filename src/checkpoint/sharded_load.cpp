// src/checkpoint/sharded_load.cpp — load: validate and read everything aside, agree, then install.
//
// Every rank reads the manifest (checksum and consistency: read_manifest), checks it against
// the registration, then runs the file checks of the one validation path (validate.hpp) with
// the files spread over the ranks, so that together they check every file's header and CRC32C
// once, and reads the byte ranges that make up its shard in the current layout, all into fresh
// buffers; the ranks agree; only then is the optimizer changed (the caller then synchronises
// the parameters as after a step).
#include <algorithm>
#include <array>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/store.hpp"
#include "checkpoint/validate.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// Everything a load reads, held aside until every rank has succeeded.
struct PreparedLoad {
  Manifest manifest;
  optim::StateMask kinds{};
  int64_t shard_numel = 0;
  optim::MomentLayout moments;  // where the target shard keeps its moments (place_moments)
  optim::StateBuffers state;    // "master" over the shard, the moment kinds as `moments` places them
  optim::Q8Buffers q8;          // host: 8-bit moments are CPU state
  // In the optimizer's memory (on its device when it has one), f32.
  core::FlatBuffer params;             // this rank's shard of the parameter values
  std::vector<core::FlatBuffer> frozen;  // per param; empty for trainable ones
};

// Where a buffer of the target shard takes its elements from: parameter pieces at buffer offsets.
struct Placed {
  int32_t param;
  int64_t param_offset;
  int64_t length;
  int64_t at;  // offset in the buffer
};

// Where state kind `kind` of the shard keeps each segment, as place_moments() put it; kMaster
// (also "params"): every segment at its shard offset.
std::vector<Placed> placements(const partition::RankShard& shard, const optim::MomentLayout& moments, std::size_t kind) {
  std::vector<Placed> out;
  for (std::size_t i = 0; i < shard.segments.size(); ++i) {
    const partition::Segment& s = shard.segments[i];
    const int64_t at = moments.places[i].offset[kind];
    if (s.length > 0 && at >= 0) out.push_back(Placed{s.param, s.param_offset, s.length, at});
  }
  return out;
}

// Elements [first, first + count) of a buffer placed as `placed` from `tensor` into `out`
// (host): the pieces' values, zeros between them. Queued; the caller flushes.
void read_placed_range(CheckpointReader& reader, const std::string& tensor, const std::vector<Placed>& placed,
                       int64_t first, int64_t count, float* out) {
  std::fill(out, out + count, 0.f);
  const int64_t end = first + count;
  for (const Placed& s : placed) {
    const int64_t lo = std::max(first, s.at);
    const int64_t hi = std::min(end, s.at + s.length);
    if (lo >= hi) continue;
    reader.read_param_range(tensor, s.param, s.param_offset + (lo - s.at), hi - lo, out + (lo - first));
  }
}

// Reads into the prepared buffers through the staging slots: the file reads of chunk k+1 go
// on while chunk k is copied to the device. No host copy of the shard is ever whole.
void read_staged(CopyEngine& engine, CheckpointReader& reader, const partition::RankShard& shard,
                 PreparedLoad& prep) {
  std::vector<StagedRegion> regions;
  std::vector<std::string> tensors;  // per region; "" for a frozen parameter's
  std::vector<int32_t> frozen_param;
  std::vector<const std::vector<Placed>*> region_places;
  std::array<std::vector<Placed>, optim::kStateKinds> by_kind;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) by_kind[k] = placements(shard, prep.moments, k);
  auto add = [&](core::FlatBuffer& buffer, const std::string& tensor, int32_t param, const std::vector<Placed>* placed) {
    regions.push_back(StagedRegion{buffer.data(), DType::f32, buffer.numel()});
    tensors.push_back(tensor);
    frozen_param.push_back(param);
    region_places.push_back(placed);
  };
  add(prep.params, kParamsTensor, -1, &by_kind[optim::kMaster]);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    // A kind the files lack stays as allocated: zeros.
    if (prep.kinds[k] && reader.has_tensor(optim::kStateNames[k])) {
      add(prep.state[k], optim::kStateNames[k], -1, &by_kind[k]);
    }
  }
  for (std::size_t i = 0; i < prep.frozen.size(); ++i) {
    if (!prep.frozen[i].empty()) add(prep.frozen[i], "", static_cast<int32_t>(i), nullptr);
  }
  stage_in(engine, regions, [&](const StagedChunk& chunk) {
    for (const StagedPiece& p : chunk.pieces) {
      float* out = reinterpret_cast<float*>(p.host);
      if (frozen_param[p.region] >= 0) {
        reader.read_frozen_range(frozen_param[p.region], p.first, p.count, out);
      } else {
        read_placed_range(reader, tensors[p.region], *region_places[p.region], p.first, p.count, out);
      }
    }
    reader.flush();
  });
}

// A checkpoint keeps each parameter's moments as 8-bit codes or as fp32 values, as its group's
// state_precision said when it was saved; loading them into the other form is refused (no
// silent requantisation). Error(mismatch) naming the first parameter that differs.
void check_same_state_precision(const optim::ParamTable& table, const Manifest& m, const std::string& source) {
  for (std::size_t i = 0; i < table.size(); ++i) {
    const optim::ParamRecord& p = table.params()[i];
    const bool here = p.trainable && table.q8_moments(p);
    const bool saved = m.params[i].q8;
    SHARDOPT_CHECK(here == saved, mismatch,
                   "{} keeps the moments of '{}' as {}, but here its group {} keeps {}: a checkpoint loads into the "
                   "state_precision it was saved with (8-bit moments are not converted to fp32 or back)",
                   source, p.name, saved ? "8-bit codes (state_precision q8)" : "fp32 values", p.group,
                   here ? "8-bit moments (state_precision q8)" : "fp32 moments");
  }
  // The load places 8-bit moments by this optimizer's flags (which params keep them depends on
  // which are trainable): the saved trainable flags must be these.
  for (std::size_t i = 0; i < table.size() && table.any_q8(); ++i) {
    SHARDOPT_CHECK(table.params()[i].trainable == m.params[i].trainable, mismatch,
                   "{} has '{}' {}, but it is {} here, and an optimizer with state_precision = q8 groups loads "
                   "only a checkpoint of the same trainable parameters (set_trainable to match it first)",
                   source, m.params[i].name, m.params[i].trainable ? "trainable" : "frozen",
                   table.params()[i].trainable ? "trainable" : "frozen");
  }
}

PreparedLoad prepare_load(const OptimizerParts& parts, const std::string& dir) {
  const optim::DeviceContext& dev = parts.dev;
  PreparedLoad prep;
  prep.manifest = read_manifest(dir);
  const Manifest& m = prep.manifest;
  const std::string source = fmt::format("checkpoint '{}'", dir);
  // Another model's checkpoint is refused before any shard file is read.
  check_same_model(parts.table, m, source);
  check_same_state_precision(parts.table, m, source);

  CheckpointReader reader(dir, m);
  // Each file's header and checksum are checked by one rank (files spread round-robin), so
  // together the ranks read every byte once; at the same world size that is each rank's own.
  check_checkpoint_files(reader, FileShare{dev.rank(), dev.world()});

  // The layout this optimizer will have: its own strategy and world, the saved trainable flags.
  const std::vector<partition::ParamInfo> infos = layout_infos(m);
  const partition::Layout target =
      partition::make_layout(optim::strategy_of(parts.config), infos, dev.world(), optim::kShardAlignment);
  const partition::RankShard& shard = target.shards[static_cast<std::size_t>(dev.rank())];
  prep.shard_numel = shard.numel;
  // bf16/f16 optimizers also keep their fp32 masters (a "master" state kind). A kind the
  // checkpoint holds beyond what its groups need now (momentum switched off after it was
  // created) is state torch keeps too: it is loaded, not dropped.
  std::vector<Algorithm> algorithms;
  for (std::size_t g = 0; g < m.groups.size(); ++g) algorithms.push_back(group_algorithm(m, g));
  prep.kinds = optim::state_kinds_needed(algorithms, parts.table.dtype(), m.groups);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    prep.kinds[k] = prep.kinds[k] || reader.has_tensor(optim::kStateNames[k]);
  }

  // Fresh buffers where the optimizer keeps its state (host, or its device).
  prep.moments = parts.shard.place_moments(shard);
  prep.params = dev.new_buffer(shard.numel);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (prep.kinds[k]) prep.state[k] = dev.new_buffer(prep.moments.numel[k]);
  }
  // 8-bit moments: read straight into host buffers (each parameter's codes and blocks whole).
  for (std::size_t mo = 0; mo < 2; ++mo) {
    prep.q8.codes[mo] = dev.new_buffer(prep.moments.code_numel, DType::byte);
    prep.q8.absmax[mo] = dev.new_buffer(prep.moments.blocks);
  }
  for (std::size_t i = 0; i < shard.segments.size(); ++i) {
    const partition::Segment& s = shard.segments[i];
    const optim::MomentPlace& place = prep.moments.places[i];
    if (!place.q8) continue;
    for (std::size_t mo = 0; mo < 2; ++mo) {
      reader.read_q8(s.param, mo, static_cast<uint8_t*>(prep.q8.codes[mo].raw()) + place.code_offset,
                     prep.q8.absmax[mo].data() + place.block_offset);
    }
  }
  prep.frozen.resize(m.params.size());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (!m.params[i].trainable) prep.frozen[i] = dev.new_buffer(m.params[i].numel);
  }
  if (const std::unique_ptr<CopyEngine> engine = staging_engine(dev, parts.staging)) {
    read_staged(*engine, reader, shard, prep);
    return prep;
  }
  auto read_shard = [&](const std::string& tensor, const std::vector<Placed>& placed, float* out) {
    for (const Placed& s : placed) reader.read_param_range(tensor, s.param, s.param_offset, s.length, out + s.at);
  };
  read_shard(kParamsTensor, placements(shard, prep.moments, optim::kMaster), prep.params.data());
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (prep.kinds[k] && reader.has_tensor(optim::kStateNames[k])) {
      read_shard(optim::kStateNames[k], placements(shard, prep.moments, k), prep.state[k].data());
    }
  }
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (!prep.frozen[i].empty()) reader.read_frozen(static_cast<int32_t>(i), prep.frozen[i].data());
  }
  reader.flush();
  return prep;
}

// Collective only through the layout rebuild (when trainable flags change), which every rank
// reaches alike.
void install(const OptimizerParts& parts, PreparedLoad& prep) {
  const Manifest& m = prep.manifest;
  optim::ParamTable& table = parts.table;
  bool flags_changed = false;
  std::vector<bool> without_master(table.size(), false);
  for (std::size_t i = 0; i < table.size(); ++i) {
    optim::ParamRecord& p = table.param(static_cast<ParamId>(i));
    flags_changed = flags_changed || p.trainable != m.params[i].trainable;
    p.trainable = m.params[i].trainable;
    p.step = m.params[i].step;
    p.has_momentum_buffer = m.params[i].has_momentum_buffer;
  }
  for (std::size_t g = 0; g < m.groups.size(); ++g) table.group(static_cast<int>(g)) = m.groups[g];
  // A checkpoint without loss scaling leaves this optimizer's scale as it is.
  if (parts.config.loss_scaling.enabled && m.has_loss_scale) parts.step.set_loss_scale(m.loss_scale, m.growth_tracker);
  if (flags_changed) parts.shard.rebuild();
  SHARDOPT_CHECK(parts.shard.own_shard().numel == prep.shard_numel, internal,
                 "load: the rebuilt shard has {} elements, the prepared one {}", parts.shard.own_shard().numel,
                 prep.shard_numel);
  for (const partition::Segment& s : parts.shard.own_shard().segments) {
    if (s.length == 0) continue;
    parts.shard.set_param_values_f32(static_cast<std::size_t>(s.param), s.param_offset, s.length,
                                     prep.params.data() + s.shard_offset);
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    const optim::ParamRecord& p = table.params()[i];
    if (!p.trainable && p.numel > 0) parts.shard.set_param_values_f32(i, 0, p.numel, prep.frozen[i].data());
  }
  // A checkpoint always holds a bf16/f16 optimizer's masters (the kinds say so); seeding is for
  // a kind the files lack.
  parts.shard.install_state(prep.kinds, std::move(prep.state), without_master, std::move(prep.q8));
}

}  // namespace

void load_checkpoint(const OptimizerParts& parts, const std::string& dir) {
  Outcome prepared;
  PreparedLoad prep;
  try {
    prep = prepare_load(parts, dir);
  } catch (const Error& e) {
    prepared.fail(e);
  } catch (const std::bad_alloc&) {
    prepared.fail(Error(ErrorCode::io, fmt::format("not enough memory to read checkpoint '{}'", dir)));
  }
  agree_on_outcomes(parts.dev.host_comm(), prepared, "load", fmt::format("load from '{}'", dir));
  install(parts, prep);
}

}  // namespace checkpoint
}  // namespace shardopt
