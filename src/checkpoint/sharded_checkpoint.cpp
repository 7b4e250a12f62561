// src/checkpoint/sharded_checkpoint.cpp — save and load: one shard file per rank, the manifest last.
//
// Save: rank 0 picks a fresh save id; every rank writes its shard file atomically; the ranks
// agree that all files exist; rank 0 commits manifest.json (temp, fsync, rename, fsync dir)
// and only then removes files of older saves. A crash before the rename leaves the previous
// manifest and every file it names untouched.
// Load: every rank reads the manifest, checks it against the registration, checks all files'
// sizes, verifies the checksums of its share of the files and reads the byte ranges that make
// up its shard in the current layout, all into fresh buffers; the ranks agree; only then is the
// optimizer changed (the caller then synchronises the parameters as after a step).
#include <algorithm>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/store.hpp"
#include "core/check.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// Shard segments in file order, so the "params" tensor is written front to back.
std::vector<partition::Segment> segments_by_shard_offset(const partition::RankShard& shard) {
  std::vector<partition::Segment> segments = shard.segments;
  std::sort(segments.begin(), segments.end(),
            [](const partition::Segment& a, const partition::Segment& b) { return a.shard_offset < b.shard_offset; });
  return segments;
}

// This rank's shard file (file `index` of `count`).
ManifestFile write_own_shard(const OptimizerParts& parts, const std::string& dir, const std::string& save_id,
                             int index, int count, const std::vector<std::string>& kinds,
                             const optim::StateMask& kind_mask) {
  const optim::ShardState& state = parts.shard;
  const std::vector<optim::ParamRecord>& params = parts.table.params();
  const partition::RankShard& shard = state.own_shard();
  int64_t frozen_numel = 0;
  for (const optim::ParamRecord& p : params) frozen_numel += p.trainable ? 0 : p.numel;
  ShardFileWriter writer(join_path(dir, shard_file_name(save_id, index, count)),
                         shard_tensors(shard.numel, kinds, frozen_numel, index), shard_metadata(save_id, index, count));
  // Parameter values, with zeros in the padding between and after segments. Files hold F32:
  // bf16/f16 values are widened (exactly) and narrowed back (exactly) on load.
  std::vector<float> wide;
  int64_t written = 0;
  for (const partition::Segment& s : segments_by_shard_offset(shard)) {
    if (s.length == 0) continue;
    writer.write_zeros(s.shard_offset - written);
    writer.write(state.param_values_f32(static_cast<std::size_t>(s.param), s.param_offset, s.length, wide), s.length);
    written = s.shard_offset + s.length;
  }
  writer.write_zeros(shard.numel - written);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!kind_mask[k]) continue;
    // A kind that hyperparameters made necessary after the last step is not allocated yet:
    // it would start as zeros, so zeros are what it holds.
    if (state.state()[k].numel() == shard.numel) {
      writer.write(state.state_data(k), shard.numel);
    } else {
      writer.write_zeros(shard.numel);
    }
  }
  if (index == 0) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) writer.write(state.param_values_f32(i, 0, params[i].numel, wide), params[i].numel);
    }
  }
  ManifestFile file = writer.commit();
  file.shard_numel = shard.numel;
  file.segments = shard.segments;
  return file;
}

// Everything a load reads, held aside until every rank has succeeded.
struct PreparedLoad {
  Manifest manifest;
  optim::StateMask kinds{};
  int64_t shard_numel = 0;
  optim::StateBuffers state;
  core::FlatBuffer params;  // this rank's shard of the parameter values
  std::vector<std::vector<float>> frozen;  // per param; empty for trainable ones
};

PreparedLoad prepare_load(const OptimizerParts& parts, const std::string& dir) {
  const optim::DeviceContext& dev = parts.dev;
  PreparedLoad prep;
  prep.manifest = read_manifest(dir);
  const Manifest& m = prep.manifest;
  const std::string source = fmt::format("checkpoint '{}'", dir);
  check_same_model(parts.config.algorithm, parts.table.params(), parts.table.groups().size(), m, source);
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    optim::validate_hyperparams(m.groups[g], parts.config.algorithm, static_cast<int>(g));
  }

  CheckpointReader reader(dir, m);
  reader.check_file_sizes();
  // Each file's checksum is verified by one rank (files spread round-robin), so together the
  // ranks read every byte once; at the same world size that is each rank's own file.
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    if (static_cast<int>(f % static_cast<std::size_t>(dev.world())) != dev.rank()) continue;
    reader.check_header(f);
    reader.verify_checksum(f);
  }

  // The layout this optimizer will have: its own strategy and world, the saved trainable flags.
  std::vector<partition::ParamInfo> infos;
  for (const ManifestParam& p : m.params) infos.push_back({p.numel, p.group, p.trainable});
  const partition::Layout target =
      partition::make_layout(optim::strategy_of(parts.config), infos, dev.world(), optim::kShardAlignment);
  const partition::RankShard& shard = target.shards[static_cast<std::size_t>(dev.rank())];
  prep.shard_numel = shard.numel;
  // bf16/f16 optimizers also keep their fp32 masters (a "master" state kind).
  prep.kinds = optim::state_kinds_needed(parts.config.algorithm, parts.table.dtype(), m.groups);

  auto read_shard = [&](const std::string& tensor, float* out) {
    for (const partition::Segment& s : shard.segments) {
      if (s.length > 0) reader.read_param_range(tensor, s.param, s.param_offset, s.length, out + s.shard_offset);
    }
  };
  prep.params.resize(shard.numel);
  read_shard(kParamsTensor, prep.params.data());
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!prep.kinds[k]) continue;
    prep.state[k].resize(shard.numel);
    if (reader.has_tensor(optim::kStateNames[k])) read_shard(optim::kStateNames[k], prep.state[k].data());
  }
  prep.frozen.resize(m.params.size());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (m.params[i].trainable) continue;
    prep.frozen[i].resize(static_cast<std::size_t>(m.params[i].numel));
    reader.read_frozen(static_cast<int32_t>(i), prep.frozen[i].data());
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
  parts.shard.install_state(prep.kinds, std::move(prep.state), without_master);
}

}  // namespace

void save_checkpoint(const OptimizerParts& parts, const std::string& dir) {
  const optim::DeviceContext& dev = parts.dev;
  Communicator& comm = dev.host_comm();
  const optim::ShardState& state = parts.shard;
  const std::string what = fmt::format("save to '{}'", dir);
  // 1. Rank 0 creates the directory and picks the identity of this save.
  Outcome setup;
  std::string save_id;
  if (dev.rank() == 0) {
    try {
      make_directories(dir);
      auto [generation, id] = next_save_identity(dir);
      setup.value0 = generation;
      save_id = id;
    } catch (const Error& e) {
      setup.fail(e);
    }
  }
  const uint64_t generation = agree_on_outcomes(comm, setup, "save", what)[0].value0;
  save_id = broadcast_string(comm, save_id, 0);

  // 2. Every rank writes its shard (one file in all when the state is not sharded).
  const int count = state.sharded() ? dev.world() : 1;
  const auto kind_mask = state.state_kinds_needed();
  const std::vector<std::string> kinds = state_kind_names(kind_mask);
  Outcome written;
  ManifestFile own_file;
  if (state.sharded() || dev.rank() == 0) {
    try {
      own_file = write_own_shard(parts, dir, save_id, state.sharded() ? dev.rank() : 0, count, kinds, kind_mask);
      written.value0 = static_cast<uint64_t>(own_file.bytes);
      written.value1 = own_file.crc32c;
    } catch (const Error& e) {
      written.fail(e);
    }
  }
  std::vector<Outcome> files;
  try {
    files = agree_on_outcomes(comm, written, "save", what);
  } catch (const Error&) {
    // This save's complete files are named by no manifest: remove them now.
    if (dev.rank() == 0 || state.sharded()) {
      remove_file_if_present(join_path(
          dir, shard_file_name(save_id, state.sharded() ? dev.rank() : 0, count)));
    }
    throw;
  }

  // Crash-safety tests stop here: shard files on disk, the manifest not yet written.
  SHARDOPT_CHECK(!test_abort_requested("shards"), internal,
                 "{}: aborted after writing the shard files (SHARDOPT_TEST_ABORT_SAVE_AFTER=shards)", what);

  // 3. Rank 0 commits the manifest, the one step that makes this save the checkpoint.
  Outcome committed;
  if (dev.rank() == 0) {
    try {
      Manifest m;
      m.generation = generation;
      m.save_id = save_id;
      m.world_size = dev.world();
      m.partition = state.layout().strategy;
      m.alignment = state.layout().alignment;
      m.algorithm = parts.config.algorithm;
      m.state_kinds = kinds;
      m.groups.assign(parts.table.groups().begin(), parts.table.groups().end());
      m.has_loss_scale = parts.config.loss_scaling.enabled;
      m.loss_scale = parts.step.loss_scale();
      m.growth_tracker = parts.step.growth_tracker();
      for (const optim::ParamRecord& p : parts.table.params()) {
        m.params.push_back({p.name, p.numel, p.dtype, p.group, p.trainable, p.step, p.has_momentum_buffer});
      }
      for (int f = 0; f < count; ++f) {
        const partition::RankShard& shard = state.layout().shards[static_cast<std::size_t>(f)];
        ManifestFile file;
        file.name = shard_file_name(save_id, f, count);
        file.bytes = static_cast<int64_t>(files[static_cast<std::size_t>(f)].value0);
        file.crc32c = static_cast<uint32_t>(files[static_cast<std::size_t>(f)].value1);
        file.shard_numel = shard.numel;
        file.segments = shard.segments;
        m.files.push_back(std::move(file));
      }
      commit_manifest(dir, m);
      remove_unreferenced_files(dir, m);
    } catch (const Error& e) {
      committed.fail(e);
    }
  }
  agree_on_outcomes(comm, committed, "save", what);
}

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
