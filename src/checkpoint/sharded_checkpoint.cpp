// src/checkpoint/sharded_checkpoint.cpp — ZeroOptimizer::save/load: one shard file per rank, the manifest last.
//
// Save: rank 0 picks a fresh save id; every rank writes its shard file atomically; the ranks
// agree that all files exist; rank 0 commits manifest.json (temp, fsync, rename, fsync dir)
// and only then removes files of older saves. A crash before the rename leaves the previous
// manifest and every file it names untouched.
// Load: every rank reads the manifest, checks it against the registration, checks all files'
// sizes, verifies the checksums of its share of the files and reads the byte ranges that make
// up its shard in the current layout, all into fresh buffers; the ranks agree; only then is the
// optimizer changed, and the parameters are synchronised as after a step.
#include <algorithm>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_access.hpp"
#include "checkpoint/store.hpp"
#include "optim/hyperparams.hpp"

namespace shardopt {

using checkpoint::Outcome;

namespace {

// The helpers take ZeroOptimizer::Impl (private to the class) as a deduced template parameter.

// Shard segments in file order, so the "params" tensor is written front to back.
std::vector<partition::Segment> segments_by_shard_offset(const partition::RankShard& shard) {
  std::vector<partition::Segment> segments = shard.segments;
  std::sort(segments.begin(), segments.end(),
            [](const partition::Segment& a, const partition::Segment& b) { return a.shard_offset < b.shard_offset; });
  return segments;
}

// This rank's shard file (file `index` of `count`).
template <typename ImplT>
checkpoint::ManifestFile write_own_shard(const ImplT& im, const std::string& dir,
                                         const std::string& save_id, int index, int count,
                                         const std::vector<std::string>& kinds,
                                         const std::array<bool, optim::kStateKinds>& kind_mask) {
  const partition::RankShard& shard = im.own_shard();
  int64_t frozen_numel = 0;
  for (const optim::ParamRecord& p : im.params) frozen_numel += p.trainable ? 0 : p.numel;
  checkpoint::ShardFileWriter writer(checkpoint::join_path(dir, checkpoint::shard_file_name(save_id, index, count)),
                                     checkpoint::shard_tensors(shard.numel, kinds, frozen_numel, index),
                                     checkpoint::shard_metadata(save_id, index, count));
  // Parameter values, with zeros in the padding between and after segments. Files hold F32:
  // bf16/f16 values are widened (exactly) and narrowed back (exactly) on load.
  std::vector<float> wide;
  int64_t written = 0;
  for (const partition::Segment& s : segments_by_shard_offset(shard)) {
    if (s.length == 0) continue;
    writer.write_zeros(s.shard_offset - written);
    writer.write(im.param_values_f32(static_cast<std::size_t>(s.param), s.param_offset, s.length, wide), s.length);
    written = s.shard_offset + s.length;
  }
  writer.write_zeros(shard.numel - written);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!kind_mask[k]) continue;
    // A kind that hyperparameters made necessary after the last step is not allocated yet:
    // it would start as zeros, so zeros are what it holds.
    if (im.state[k].numel() == shard.numel) writer.write(im.state[k].data(), shard.numel);
    else writer.write_zeros(shard.numel);
  }
  if (index == 0) {
    for (std::size_t i = 0; i < im.params.size(); ++i) {
      if (!im.params[i].trainable) writer.write(im.param_values_f32(i, 0, im.params[i].numel, wide), im.params[i].numel);
    }
  }
  checkpoint::ManifestFile file = writer.commit();
  file.shard_numel = shard.numel;
  file.segments = shard.segments;
  return file;
}

// Everything a load reads, held aside until every rank has succeeded.
struct PreparedLoad {
  checkpoint::Manifest manifest;
  std::array<bool, optim::kStateKinds> kinds{};
  int64_t shard_numel = 0;
  std::array<core::FlatBuffer, optim::kStateKinds> state;
  core::FlatBuffer params;  // this rank's shard of the parameter values
  std::vector<std::vector<float>> frozen;  // per param; empty for trainable ones
};

template <typename ImplT>
PreparedLoad prepare_load(const ImplT& im, const std::string& dir) {
  PreparedLoad prep;
  prep.manifest = checkpoint::read_manifest(dir);
  const checkpoint::Manifest& m = prep.manifest;
  const std::string source = fmt::format("checkpoint '{}'", dir);
  checkpoint::check_same_model(im.config.algorithm, im.params, im.groups.size(), m, source);
  for (std::size_t g = 0; g < m.groups.size(); ++g) {
    optim::validate_hyperparams(m.groups[g], im.config.algorithm, static_cast<int>(g));
  }

  checkpoint::CheckpointReader reader(dir, m);
  reader.check_file_sizes();
  // Each file's checksum is verified by one rank (files spread round-robin), so together the
  // ranks read every byte once; at the same world size that is each rank's own file.
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    if (static_cast<int>(f % static_cast<std::size_t>(im.world())) != im.rank()) continue;
    reader.check_header(f);
    reader.verify_checksum(f);
  }

  // The layout this optimizer will have: its own strategy and world, the saved trainable flags.
  std::vector<partition::ParamInfo> infos;
  for (const checkpoint::ManifestParam& p : m.params) infos.push_back({p.numel, p.group, p.trainable});
  const partition::Layout target =
      partition::make_layout(im.strategy(), infos, im.world(), optim::kShardAlignment);
  const partition::RankShard& shard = target.shards[static_cast<std::size_t>(im.rank())];
  prep.shard_numel = shard.numel;
  // bf16/f16 optimizers also keep their fp32 masters (a "master" state kind).
  prep.kinds = optim::state_kinds_needed(im.config.algorithm, im.dtype, m.groups);

  auto read_shard = [&](const std::string& tensor, float* out) {
    for (const partition::Segment& s : shard.segments) {
      if (s.length > 0) reader.read_param_range(tensor, s.param, s.param_offset, s.length, out + s.shard_offset);
    }
  };
  prep.params.resize(shard.numel);
  read_shard(checkpoint::kParamsTensor, prep.params.data());
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

// Collective only through rebuild_layout (when trainable flags change) and the param sync;
// every rank reaches both.
template <typename ImplT>
void install(ImplT& im, PreparedLoad& prep) {
  const checkpoint::Manifest& m = prep.manifest;
  bool flags_changed = im.layout_dirty;
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    optim::ParamRecord& p = im.params[i];
    flags_changed = flags_changed || p.trainable != m.params[i].trainable;
    p.trainable = m.params[i].trainable;
    p.step = m.params[i].step;
    p.has_momentum_buffer = m.params[i].has_momentum_buffer;
  }
  im.groups = m.groups;
  // A checkpoint without loss scaling leaves this optimizer's scale as it is.
  if (im.config.loss_scaling.enabled && m.has_loss_scale) {
    im.scale = m.loss_scale;
    im.growth_tracker = m.growth_tracker;
  }
  if (flags_changed) im.rebuild_layout();
  SHARDOPT_CHECK(im.own_shard().numel == prep.shard_numel, internal,
                 "load: the rebuilt shard has {} elements, the prepared one {}", im.own_shard().numel, prep.shard_numel);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (prep.kinds[k]) im.state[k] = std::move(prep.state[k]);
    else im.state[k].resize(0);
  }
  im.state_in_use = prep.kinds;
  for (const partition::Segment& s : im.own_shard().segments) {
    if (s.length == 0) continue;
    im.set_param_values_f32(static_cast<std::size_t>(s.param), s.param_offset, s.length, prep.params.data() + s.shard_offset);
  }
  for (std::size_t i = 0; i < im.params.size(); ++i) {
    if (!im.params[i].trainable && im.params[i].numel > 0) {
      im.set_param_values_f32(i, 0, im.params[i].numel, prep.frozen[i].data());
    }
  }
  im.sync_params();
  im.build_runs();  // runs merge params with equal steps: the steps just changed
}

}  // namespace

void ZeroOptimizer::save(const std::string& dir) {
  Impl& im = *impl_;
  checkpoint::require_host_state(im, "save");
  Communicator& comm = *im.comm;
  if (im.layout_dirty) im.rebuild_layout();
  const std::string what = fmt::format("save to '{}'", dir);

  // 1. Rank 0 creates the directory and picks the identity of this save.
  Outcome setup;
  std::string save_id;
  if (im.rank() == 0) {
    try {
      checkpoint::make_directories(dir);
      auto [generation, id] = checkpoint::next_save_identity(dir);
      setup.value0 = generation;
      save_id = id;
    } catch (const Error& e) {
      setup.fail(e);
    }
  }
  const uint64_t generation = checkpoint::agree_on_outcomes(comm, setup, what)[0].value0;
  save_id = checkpoint::broadcast_string(comm, save_id, 0);

  // 2. Every rank writes its shard (one file in all when the state is not sharded).
  const int count = im.sharded() ? im.world() : 1;
  const auto kind_mask = im.state_kinds_needed();
  const std::vector<std::string> kinds = checkpoint::state_kind_names(kind_mask);
  Outcome written;
  checkpoint::ManifestFile own_file;
  if (im.sharded() || im.rank() == 0) {
    try {
      own_file = write_own_shard(im, dir, save_id, im.sharded() ? im.rank() : 0, count, kinds, kind_mask);
      written.value0 = static_cast<uint64_t>(own_file.bytes);
      written.value1 = own_file.crc32c;
    } catch (const Error& e) {
      written.fail(e);
    }
  }
  std::vector<Outcome> files;
  try {
    files = checkpoint::agree_on_outcomes(comm, written, what);
  } catch (const Error&) {
    // This save's complete files are named by no manifest: remove them now.
    if (im.rank() == 0 || im.sharded()) {
      checkpoint::remove_file_if_present(checkpoint::join_path(
          dir, checkpoint::shard_file_name(save_id, im.sharded() ? im.rank() : 0, count)));
    }
    throw;
  }

  // Crash-safety tests stop here: shard files on disk, the manifest not yet written.
  SHARDOPT_CHECK(!checkpoint::test_abort_requested("shards"), internal,
                 "{}: aborted after writing the shard files (SHARDOPT_TEST_ABORT_SAVE_AFTER=shards)", what);

  // 3. Rank 0 commits the manifest, the one step that makes this save the checkpoint.
  Outcome committed;
  if (im.rank() == 0) {
    try {
      checkpoint::Manifest m;
      m.generation = generation;
      m.save_id = save_id;
      m.world_size = im.world();
      m.partition = im.layout.strategy;
      m.alignment = im.layout.alignment;
      m.algorithm = im.config.algorithm;
      m.state_kinds = kinds;
      m.groups = im.groups;
      m.has_loss_scale = im.config.loss_scaling.enabled;
      m.loss_scale = im.scale;
      m.growth_tracker = im.growth_tracker;
      for (const optim::ParamRecord& p : im.params) {
        m.params.push_back({p.name, p.numel, p.dtype, p.group, p.trainable, p.step, p.has_momentum_buffer});
      }
      for (int f = 0; f < count; ++f) {
        const partition::RankShard& shard = im.layout.shards[static_cast<std::size_t>(f)];
        checkpoint::ManifestFile file;
        file.name = checkpoint::shard_file_name(save_id, f, count);
        file.bytes = static_cast<int64_t>(files[static_cast<std::size_t>(f)].value0);
        file.crc32c = static_cast<uint32_t>(files[static_cast<std::size_t>(f)].value1);
        file.shard_numel = shard.numel;
        file.segments = shard.segments;
        m.files.push_back(std::move(file));
      }
      checkpoint::commit_manifest(dir, m);
      checkpoint::remove_unreferenced_files(dir, m);
    } catch (const Error& e) {
      committed.fail(e);
    }
  }
  checkpoint::agree_on_outcomes(comm, committed, what);
}

void ZeroOptimizer::load(const std::string& dir) {
  Impl& im = *impl_;
  checkpoint::require_host_state(im, "load");
  if (im.layout_dirty) im.rebuild_layout();
  Outcome prepared;
  PreparedLoad prep;
  try {
    prep = prepare_load(im, dir);
  } catch (const Error& e) {
    prepared.fail(e);
  } catch (const std::bad_alloc&) {
    prepared.fail(Error(ErrorCode::io, fmt::format("not enough memory to read checkpoint '{}'", dir)));
  }
  checkpoint::agree_on_outcomes(*im.comm, prepared, fmt::format("load from '{}'", dir));
  install(im, prep);
}

}  // namespace shardopt
