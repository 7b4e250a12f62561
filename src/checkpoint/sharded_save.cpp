// src/checkpoint/sharded_save.cpp — save: one shard file per rank, proven as rank 0 sees them, then the manifest.
//
// 1. Every rank checks the hyperparameters a load will check, and makes the directory (as it
//    sees it); rank 0 picks a fresh save id.
// 2. Every rank writes its shard file atomically; the ranks agree on the files' sizes and CRCs.
// 3. The proof, before anything is committed: rank 0 builds the manifest, runs check_manifest
//    on it and the full file checks of the one validation path (validate.hpp) on every shard
//    file as rank 0 sees it; every other rank opens rank 0's shard file. When a rank misses a
//    file, the ranks do not share the directory: the save fails on every rank, saying so, each
//    rank removes its own new file, and the previous checkpoint is untouched.
// 4. Rank 0 commits manifest.json (temp, fsync, rename, fsync dir), reads it back, and only
//    then removes the files of older saves. A crash before the rename leaves the previous
//    manifest and every file it names untouched.
#include <algorithm>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/store.hpp"
#include "checkpoint/validate.hpp"
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

// The manifest of this save, from rank 0's state and every rank's file outcome.
Manifest build_manifest(const OptimizerParts& parts, uint64_t generation, const std::string& save_id, int count,
                        const std::vector<std::string>& kinds, const std::vector<Outcome>& files) {
  const optim::ShardState& state = parts.shard;
  Manifest m;
  m.generation = generation;
  m.save_id = save_id;
  m.world_size = parts.dev.world();
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
  return m;
}

std::string not_shared(const std::string& dir, const std::string& missing) {
  return fmt::format(
      "the ranks do not share the checkpoint directory: {}, as seen from '{}'. Every rank must save to the same "
      "directory on a filesystem all of them share (a relative path names another directory from another working "
      "directory); nothing was committed, the previous checkpoint is unchanged",
      missing, absolute_path(dir));
}

// Rank 0's proof: the checkpoint about to be committed passes the one validation path, every
// file read in full as rank 0 sees it. A file that is missing is named as not shared.
void prove_on_rank0(const Manifest& m, const std::string& dir) {
  check_manifest(m, join_path(dir, kManifestName) + " (about to be written)");
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    const std::string path = join_path(dir, m.files[f].name);
    SHARDOPT_CHECK(can_open(path), io, "{}",
                   not_shared(dir, fmt::format("rank {} wrote '{}' but rank 0 cannot find it", f, m.files[f].name)));
  }
  CheckpointReader reader(dir, m);
  check_checkpoint_files(reader);
}

// Another rank's half of the proof: it sees rank 0's file, with the size rank 0 reported.
void prove_on_other_rank(const std::string& dir, const std::string& rank0_file, int64_t bytes, int rank) {
  const std::string path = join_path(dir, rank0_file);
  SHARDOPT_CHECK(can_open(path), io, "{}",
                 not_shared(dir, fmt::format("rank 0 wrote '{}' but rank {} cannot find it", rank0_file, rank)));
  const InputFile input(path);
  SHARDOPT_CHECK(input.size() == bytes, io, "{}",
                 not_shared(dir, fmt::format("rank 0 wrote '{}' with {} bytes but rank {} sees {}", rank0_file, bytes,
                                             rank, input.size())));
}

// The test hook: flips the last byte of a file that was just written (after its CRC was taken).
void damage_for_test(const std::string& path) {
  std::string bytes = read_whole_file(path);
  if (bytes.empty()) return;
  bytes.back() = static_cast<char>(bytes.back() ^ 0x01);
  AtomicFileWriter rewrite(path);
  rewrite.write(bytes.data(), bytes.size());
  rewrite.commit();
}

}  // namespace

void save_checkpoint(const OptimizerParts& parts, const std::string& dir) {
  const optim::DeviceContext& dev = parts.dev;
  Communicator& comm = dev.host_comm();
  const optim::ShardState& state = parts.shard;
  const std::string what = fmt::format("save to '{}'", dir);
  // 1. Every rank makes the directory: on a networked filesystem a mkdir goes to the server,
  // where a lookup might trust a stale cache. Rank 0 picks the identity of this save.
  Outcome setup;
  std::string save_id;
  bool created_dir = false;
  try {
    // A checkpoint whose hyperparameters a load would refuse is not worth writing.
    for (std::size_t g = 0; g < parts.table.groups().size(); ++g) {
      optim::validate_hyperparams(parts.table.groups()[g], parts.config.algorithm, static_cast<int>(g));
    }
    created_dir = !directory_exists(dir);
    make_directories(dir);
    if (dev.rank() == 0) {
      auto [generation, id] = next_save_identity(dir);
      setup.value0 = generation;
      save_id = id;
    }
  } catch (const Error& e) {
    setup.fail(e);
  }
  auto forget_dir = [&] {
    if (created_dir) remove_directory_if_empty(dir);
  };
  std::vector<Outcome> setups;
  try {
    setups = agree_on_outcomes(comm, setup, "save", what);
  } catch (const Error&) {
    forget_dir();
    throw;
  }
  const uint64_t generation = setups[0].value0;
  save_id = broadcast_string(comm, save_id, 0);

  // 2. Every rank writes its shard (one file in all when the state is not sharded).
  const int count = state.sharded() ? dev.world() : 1;
  const bool writes = state.sharded() || dev.rank() == 0;
  const std::string own_path = join_path(dir, shard_file_name(save_id, state.sharded() ? dev.rank() : 0, count));
  const auto kind_mask = state.state_kinds_needed();
  const std::vector<std::string> kinds = state_kind_names(kind_mask);
  auto forget_own_file = [&] {
    if (writes) remove_file_if_present(own_path);
    forget_dir();
  };
  Outcome written;
  if (writes) {
    try {
      const ManifestFile own_file =
          write_own_shard(parts, dir, save_id, state.sharded() ? dev.rank() : 0, count, kinds, kind_mask);
      written.value0 = static_cast<uint64_t>(own_file.bytes);
      written.value1 = own_file.crc32c;
      if (test_damage_requested(dev.rank())) damage_for_test(own_path);
    } catch (const Error& e) {
      written.fail(e);
    }
  }
  std::vector<Outcome> files;
  try {
    files = agree_on_outcomes(comm, written, "save", what);
  } catch (const Error&) {
    // This save's complete files are named by no manifest: remove them now.
    forget_own_file();
    throw;
  }

  // Crash-safety tests stop here: shard files on disk, the manifest not yet written.
  SHARDOPT_CHECK(!test_abort_requested("shards"), internal,
                 "{}: aborted after writing the shard files (SHARDOPT_TEST_ABORT_SAVE_AFTER=shards)", what);

  // 3. The proof: the checkpoint is complete as rank 0 sees it, and every rank sees rank 0's file.
  Manifest m;
  Outcome proven;
  try {
    if (dev.rank() == 0) {
      m = build_manifest(parts, generation, save_id, count, kinds, files);
      prove_on_rank0(m, dir);
    } else {
      prove_on_other_rank(dir, shard_file_name(save_id, 0, count), static_cast<int64_t>(files[0].value0), dev.rank());
    }
  } catch (const Error& e) {
    proven.fail(e);
  }
  try {
    agree_on_outcomes(comm, proven, "save", what);
  } catch (const Error&) {
    forget_own_file();
    throw;
  }

  // 4. Rank 0 commits the manifest, the one step that makes this save the checkpoint, reads it
  // back, and only then sweeps older files away.
  Outcome committed;
  if (dev.rank() == 0) {
    try {
      commit_manifest(dir, m);
      remove_unreferenced_files(dir, m);
    } catch (const Error& e) {
      committed.fail(e);
    }
  }
  agree_on_outcomes(comm, committed, "save", what);
}

}  // namespace checkpoint
}  // namespace shardopt
