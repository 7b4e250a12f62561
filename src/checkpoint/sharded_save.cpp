// src/checkpoint/sharded_save.cpp — save: one shard file per rank, proven by the ranks together, then the manifest.
//
// 1. Every rank checks the hyperparameters a load will check, and makes the directory (as it
//    sees it); rank 0 picks a fresh save id.
// 2. Every rank writes its shard file atomically; the ranks agree on the files' sizes and CRCs.
// 3. The proof, before anything is committed: every rank builds the manifest; rank 0 runs
//    check_manifest on it; every rank checks that it sees every shard file with the size its
//    writer reported, and runs the full file checks of the one validation path (validate.hpp:
//    header and CRC32C) on the files it wrote, as a load spreads them, so no rank reads more
//    than its own share; the ranks then agree on the outcome. When a rank misses a file, the
//    ranks do not share the directory: the save fails on every rank, saying so. On any failure
//    each rank removes its own new file, and the previous checkpoint is untouched.
// 4. Rank 0 commits manifest.json (temp, fsync, rename, fsync dir), reads it back, and only
//    then removes the files of older saves. A crash before the rename leaves the previous
//    manifest and every file it names untouched.
//
// The steps are three phases (save_phases.hpp): save() runs them back to back, save_async()
// (async_save.hpp) runs the write on its own thread. Both write the same bytes.
#include <algorithm>

#include "checkpoint/collective.hpp"
#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/save_phases.hpp"
#include "checkpoint/store.hpp"
#include "checkpoint/validate.hpp"
#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
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

// Where each element of this rank's shard file comes from, in file order: parameter values
// with zeros in the padding between and after segments, each state kind, and (file 0) the
// frozen parameters. Files hold F32: bf16/f16 values are widened (exactly) as they are written
// and narrowed back (exactly) on load.
std::vector<ShardSource> shard_sources(const OptimizerParts& parts, int index, const optim::StateMask& kind_mask) {
  const optim::ShardState& state = parts.shard;
  const std::vector<optim::ParamRecord>& params = parts.table.params();
  const partition::RankShard& shard = state.own_shard();
  const DType dtype = state.dtype();
  std::vector<ShardSource> sources;
  auto zeros = [&](int64_t count) {
    if (count > 0) sources.push_back(ShardSource{nullptr, DType::f32, count});
  };
  auto values = [&](std::size_t param, int64_t offset, int64_t count) {
    if (count > 0) sources.push_back(ShardSource{optim::element(state.param_ptr(param), offset, dtype), dtype, count});
  };
  int64_t written = 0;
  for (const partition::Segment& s : segments_by_shard_offset(shard)) {
    if (s.length == 0) continue;
    zeros(s.shard_offset - written);
    values(static_cast<std::size_t>(s.param), s.param_offset, s.length);
    written = s.shard_offset + s.length;
  }
  zeros(shard.numel - written);
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (!kind_mask[k]) continue;
    // Each kind as the optimizer keeps it (FileMoments: the file's placement is the same).
    const int64_t numel = state.state_numel(k);
    // A kind that hyperparameters made necessary after the last step is not allocated yet:
    // it would start as zeros, so zeros are what it holds.
    if (state.state()[k].numel() == numel && numel > 0) {
      sources.push_back(ShardSource{state.state_data(k), DType::f32, numel});
    } else {
      zeros(numel);
    }
  }
  if (index == 0) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!params[i].trainable) values(i, 0, params[i].numel);
    }
  }
  return sources;
}

// Widening scratch of the writer: bounded, whatever the size of a parameter.
constexpr int64_t kWidenChunk = int64_t{1} << 20;

// This rank's 8-bit moments in file order (shard_tensors): both absmax buffers, then both codes.
std::vector<ShardSource> q8_sources(const optim::ShardState& state) {
  std::vector<ShardSource> sources;
  if (state.q8_codes(0).numel() == 0) return sources;
  for (std::size_t m = 0; m < 2; ++m) {
    sources.push_back(ShardSource{state.q8_absmax(m).raw(), DType::f32, state.q8_absmax(m).numel()});
  }
  for (std::size_t m = 0; m < 2; ++m) {
    sources.push_back(ShardSource{state.q8_codes(m).raw(), DType::byte, state.q8_codes(m).numel()});
  }
  return sources;
}

// The manifest of this save as the optimizer stands at its start (rank 0's state); the files'
// sizes and CRCs are filled in once every rank has written its file.
Manifest build_manifest(const OptimizerParts& parts, uint64_t generation, const std::string& save_id, int count,
                        const std::vector<std::string>& kinds) {
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
  m.group_algorithms.assign(parts.table.algorithms().begin(), parts.table.algorithms().end());
  m.has_loss_scale = parts.config.loss_scaling.enabled;
  m.loss_scale = parts.step.loss_scale();
  m.growth_tracker = parts.step.growth_tracker();
  for (const optim::ParamRecord& p : parts.table.params()) {
    m.params.push_back({p.name, p.numel, p.dtype, p.group, p.trainable, p.step, p.has_momentum_buffer, p.shape,
                        p.trainable && parts.table.q8_moments(p)});
  }
  // ShardState places moments by algorithm; the files say so where that differs from formats 1/2.
  m.moments_by_algorithm = moment_kinds_differ(m);
  for (int f = 0; f < count; ++f) {
    const partition::RankShard& shard = state.layout().shards[static_cast<std::size_t>(f)];
    ManifestFile file;
    file.name = shard_file_name(save_id, f, count);
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

// This rank's part of the proof over `m` (complete with every file's size and CRC): every file
// is where this rank looks (a missing one is named as not shared) with the size its writer
// reported, and the files of this rank's share (file f is written by rank f, and checked by it)
// pass the header and CRC32C checks of the one validation path. Rank 0 also checks the manifest
// it is about to commit.
void prove_share(const Manifest& m, const std::string& dir, int rank, int world) {
  if (rank == 0) check_manifest(m, join_path(dir, kManifestName) + " (about to be written)");
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    const std::string path = join_path(dir, m.files[f].name);
    SHARDOPT_CHECK(can_open(path), io, "{}",
                   not_shared(dir, fmt::format("rank {} wrote '{}' but rank {} cannot find it", f, m.files[f].name,
                                               rank)));
  }
  CheckpointReader reader(dir, m);
  check_checkpoint_files(reader, FileShare{rank, world});
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

SaveTicket start_save(const OptimizerParts& parts, const std::string& dir) {
  const optim::DeviceContext& dev = parts.dev;
  Communicator& comm = dev.host_comm();
  const optim::ShardState& state = parts.shard;
  SaveTicket t;
  t.dir = dir;
  t.what = fmt::format("save to '{}'", dir);
  t.rank = dev.rank();
  t.widen_threads = parts.config.cpu_threads;
  // 1. Every rank makes the directory: on a networked filesystem a mkdir goes to the server,
  // where a lookup might trust a stale cache. Rank 0 picks the identity of this save.
  Outcome setup;
  try {
    // A checkpoint whose hyperparameters a load would refuse is not worth writing.
    for (std::size_t g = 0; g < parts.table.groups().size(); ++g) {
      optim::validate_hyperparams(parts.table.groups()[g], parts.table.algorithm(static_cast<int>(g)), static_cast<int>(g));
    }
    t.created_dir = !directory_exists(dir);
    make_directories(dir);
    if (dev.rank() == 0) {
      auto [generation, id] = next_save_identity(dir);
      setup.value0 = generation;
      t.save_id = id;
    }
  } catch (const Error& e) {
    setup.fail(e);
  }
  std::vector<Outcome> setups;
  try {
    setups = agree_on_outcomes(comm, setup, "save", t.what);
  } catch (const Error&) {
    if (t.created_dir) remove_directory_if_empty(dir);
    throw;
  }
  t.generation = setups[0].value0;
  t.save_id = broadcast_string(comm, t.save_id, 0);

  // What step 2 writes (one file in all when the state is not sharded), and the manifest as
  // the optimizer stands now.
  t.count = state.sharded() ? dev.world() : 1;
  t.file_index = state.sharded() ? dev.rank() : 0;
  t.writes = state.sharded() || dev.rank() == 0;
  t.own_path = join_path(dir, shard_file_name(t.save_id, t.file_index, t.count));
  const optim::StateMask kind_mask = state.state_kinds_needed();
  t.kinds = state_kind_names(kind_mask);
  t.shard_numel = state.own_shard().numel;
  for (const optim::ParamRecord& p : parts.table.params()) t.frozen_numel += p.trainable ? 0 : p.numel;
  if (t.writes) {
    t.sources = shard_sources(parts, t.file_index, kind_mask);
    t.q8_sources = q8_sources(state);
    // A rank that cannot stage (no pinned memory) fails the save through the agreement on
    // the files, as a failed write does.
    try {
      t.engine = staging_engine(dev, parts.staging);
    } catch (const Error& e) {
      t.staging_failure.fail(e);
    }
  }
  for (const ShardSource& s : t.sources) t.source_bytes += s.count * static_cast<int64_t>(sizeof(float));
  for (const ShardSource& s : t.q8_sources) t.source_bytes += s.count * static_cast<int64_t>(dtype_size(s.dtype));
  // On every rank: each proves its own files against it (rank 0's is the one committed).
  t.manifest = build_manifest(parts, t.generation, t.save_id, t.count, t.kinds);
  t.moments = file_moments(t.manifest, static_cast<std::size_t>(t.file_index));
  SHARDOPT_CHECK(t.moments.code_numel == state.q8_codes(0).numel(), internal,
                 "save: the file keeps {} 8-bit codes per moment, the shard {}", t.moments.code_numel,
                 state.q8_codes(0).numel());
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    SHARDOPT_CHECK(!kind_mask[k] || t.moments.numel[k] == state.state_numel(k), internal,
                   "save: the file keeps {} elements of '{}', the shard {}", t.moments.numel[k], optim::kStateNames[k],
                   state.state_numel(k));
  }
  return t;
}

Outcome write_own_shard_file(const SaveTicket& t, const std::function<void(WritePoint)>& observe) {
  auto reach = [&](WritePoint point) {
    if (observe) observe(point);
  };
  Outcome written;
  if (!t.writes) {
    reach(WritePoint::kSourcesRead);
    return written;
  }
  if (!t.staging_failure.ok) {
    reach(WritePoint::kSourcesRead);
    return t.staging_failure;
  }
  bool sources_read = false;
  try {
    ShardFileWriter writer(t.own_path,
                           shard_tensors(t.shard_numel, t.kinds, t.frozen_numel, t.file_index, t.moments),
                           shard_metadata(t.save_id, t.file_index, t.count, t.moments.format));
    std::vector<float> wide;
    int64_t bytes = 0;
    bool half_reported = false;
    // Appends `count` elements of `dtype` at host memory `data` (null: zeros) to the file,
    // widened to f32 in bounded steps.
    auto append = [&](const void* data, DType dtype, int64_t count) {
      if (data == nullptr) {
        writer.write_zeros(count);
      } else if (dtype == DType::byte) {
        writer.write_bytes(data, count);
      } else if (dtype == DType::f32) {
        writer.write(static_cast<const float*>(data), count);
      } else {
        for (int64_t at = 0; at < count; at += kWidenChunk) {
          const int64_t n = std::min(kWidenChunk, count - at);
          wide.resize(static_cast<std::size_t>(n));
          kernels::widen_cpu(optim::element(data, at, dtype), dtype, wide.data(), n, t.widen_threads);
          writer.write(wide.data(), n);
        }
      }
      bytes += count * static_cast<int64_t>(data == nullptr ? sizeof(float) : dtype == DType::byte ? 1 : sizeof(float));
      if (!half_reported && 2 * bytes >= t.source_bytes) {
        half_reported = true;
        reach(WritePoint::kHalfWritten);
      }
    };
    if (t.engine) {
      // The same bytes, through the staging slots: chunk k+1 is copied while chunk k is written.
      std::vector<StagedRegion> regions;  // stage_out only reads them
      for (const ShardSource& s : t.sources) {
        regions.push_back(StagedRegion{const_cast<void*>(s.data), s.data == nullptr ? DType::f32 : s.dtype, s.count});
      }
      stage_out(*t.engine, regions, [&](const StagedChunk& chunk) {
        for (const StagedPiece& p : chunk.pieces) append(p.host, regions[p.region].dtype, p.count);
      });
    } else {
      for (const ShardSource& s : t.sources) append(s.data, s.dtype, s.count);
    }
    for (const ShardSource& s : t.q8_sources) append(s.data, s.dtype, s.count);
    sources_read = true;
    reach(WritePoint::kSourcesRead);
    const ManifestFile own_file = writer.commit();
    written.value0 = static_cast<uint64_t>(own_file.bytes);
    written.value1 = own_file.crc32c;
    if (test_damage_requested(t.rank)) damage_for_test(t.own_path);
    reach(WritePoint::kCommitted);
  } catch (const Error& e) {
    written.fail(e);
  } catch (const std::exception& e) {
    written.fail(Error(ErrorCode::internal, fmt::format("writing '{}' failed: {}", t.own_path, e.what())));
  }
  if (!sources_read) reach(WritePoint::kSourcesRead);
  return written;
}

void abandon_save(const SaveTicket& t) noexcept {
  if (t.writes) remove_file_if_present(t.own_path);
  if (t.created_dir) remove_directory_if_empty(t.dir);
}

void finish_save(Communicator& comm, const SaveTicket& t, const Outcome& written) {
  const std::string& what = t.what;
  const std::string& dir = t.dir;
  // 2 (end). The ranks agree on the files' sizes and CRCs.
  std::vector<Outcome> files;
  try {
    files = agree_on_outcomes(comm, written, "save", what);
  } catch (const Error&) {
    // This save's complete files are named by no manifest: remove them now.
    abandon_save(t);
    throw;
  }

  // Crash-safety tests stop here: shard files on disk, the manifest not yet written.
  SHARDOPT_CHECK(!test_abort_requested("shards"), internal,
                 "{}: aborted after writing the shard files (SHARDOPT_TEST_ABORT_SAVE_AFTER=shards)", what);

  // 3. The proof: every rank sees every file, and each file passes its writer's full check.
  Manifest m = t.manifest;
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    m.files[f].bytes = static_cast<int64_t>(files[f].value0);
    m.files[f].crc32c = static_cast<uint32_t>(files[f].value1);
  }
  Outcome proven;
  try {
    prove_share(m, dir, t.rank, comm.size());
  } catch (const Error& e) {
    proven.fail(e);
  }
  try {
    agree_on_outcomes(comm, proven, "save", what);
  } catch (const Error&) {
    abandon_save(t);
    throw;
  }

  // 4. Rank 0 commits the manifest, the one step that makes this save the checkpoint, reads it
  // back, and only then sweeps older files away.
  Outcome committed;
  if (t.rank == 0) {
    try {
      commit_manifest(dir, m);
      remove_unreferenced_files(dir, m);
    } catch (const Error& e) {
      committed.fail(e);
    }
  }
  agree_on_outcomes(comm, committed, "save", what);
}

void save_checkpoint(const OptimizerParts& parts, const std::string& dir) {
  const SaveTicket ticket = start_save(parts, dir);
  // 2. Every rank writes its shard; finish_save runs steps 2 (the agreement) to 4.
  const Outcome written = write_own_shard_file(ticket, {});
  finish_save(parts.dev.host_comm(), ticket, written);
}

}  // namespace checkpoint
}  // namespace shardopt
