// src/checkpoint/offline.cpp — info, verify, export and reshard of checkpoint directories, without MPI.
#include <algorithm>

#include "checkpoint/optimizer_parts.hpp"
#include "checkpoint/store.hpp"
#include "checkpoint/validate.hpp"
#include "core/check.hpp"
#include "shardopt/checkpoint.hpp"

namespace shardopt {
namespace {

// Bounds the memory of export and reshard: they stream any checkpoint through this buffer.
constexpr int64_t kChunkElements = int64_t{4} << 20;

// Every offline operation opens the checkpoint through the one validation path, reading every
// file in full: what it reports, exports or reshards is what a load would accept.
checkpoint::CheckpointReader open_verified(const std::string& dir, const CheckpointProgress& progress) {
  return checkpoint::open_checked_checkpoint(dir, checkpoint::FileShare{}, progress);
}

// Streams elements [offset, offset + length) of `param`'s `tensor` from the reader to the writer.
void copy_range(checkpoint::CheckpointReader& reader, const std::string& tensor, int32_t param, int64_t offset,
                int64_t length, checkpoint::ShardFileWriter& writer, std::vector<float>& buffer) {
  for (int64_t done = 0; done < length;) {
    const int64_t n = std::min(kChunkElements, length - done);
    buffer.resize(static_cast<std::size_t>(n));
    reader.read_param_range(tensor, param, offset + done, n, buffer.data());
    reader.flush();
    writer.write(buffer.data(), n);
    done += n;
  }
}

// The offline tools write fp32 moments per element; a checkpoint with 8-bit moments reshards
// when an optimizer at the new world size loads it.
void refuse_q8(const checkpoint::Manifest& m, const std::string& dir, const char* tool) {
  SHARDOPT_CHECK(!checkpoint::any_q8(m), unsupported,
                 "{}: checkpoint '{}' holds 8-bit moments (state_precision q8), which the offline {} does not convert; "
                 "load it into an optimizer at the wanted world size instead (a load reshards)",
                 tool, dir, tool);
}

std::string parent_directory(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& dir) {
  const checkpoint::CheckpointReader reader = open_verified(dir, {});
  const checkpoint::Manifest& m = reader.manifest();
  CheckpointInfo info;
  info.format_version = m.format_version;
  info.save_id = m.save_id;
  info.world_size = m.world_size;
  info.partition = checkpoint::strategy_name(m.partition);
  info.algorithm = m.algorithm;
  info.num_groups = static_cast<int>(m.groups.size());
  info.num_params = static_cast<int>(m.params.size());
  info.state_kinds = m.state_kinds;
  bool first = true;
  for (const checkpoint::ManifestParam& p : m.params) {
    info.numel += p.numel;
    if (!p.trainable) continue;
    info.trainable_numel += p.numel;
    info.min_step = first ? p.step : std::min(info.min_step, p.step);
    info.max_step = first ? p.step : std::max(info.max_step, p.step);
    first = false;
  }
  info.num_files = static_cast<int>(m.files.size());
  info.file_bytes = m.total_file_bytes();
  return info;
}

void verify_checkpoint(const std::string& dir, const CheckpointProgress& progress) {
  open_verified(dir, progress);
}

void export_checkpoint(const std::string& dir, const std::string& out_file, const CheckpointProgress& progress) {
  checkpoint::CheckpointReader reader = open_verified(dir, progress);
  const checkpoint::Manifest& m = reader.manifest();
  refuse_q8(m, dir, "export");
  std::vector<checkpoint::TensorEntry> tensors;
  for (const checkpoint::ManifestParam& p : m.params) {
    tensors.push_back({"param." + p.name, {p.numel}, 0, 0});
    if (!p.trainable) continue;
    for (const std::string& kind : m.state_kinds) tensors.push_back({"state." + p.name + "." + kind, {p.numel}, 0, 0});
  }
  const std::map<std::string, std::string> metadata = {
      {"format", "shardopt-consolidated"},
      {"format_version", std::to_string(checkpoint::kShardFormatVersion)},
      {"algorithm", algorithm_name(m.algorithm)},
      {"params", checkpoint::params_summary_json(m)},
      {"param_groups", checkpoint::groups_summary_json(m)}};
  checkpoint::ShardFileWriter writer(out_file, tensors, metadata);
  std::vector<float> buffer;
  const int64_t total_bytes = m.total_file_bytes();
  int64_t written = 0;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const checkpoint::ManifestParam& p = m.params[i];
    const auto id = static_cast<int32_t>(i);
    if (progress) progress("export", std::min(written, total_bytes), total_bytes);
    written += p.numel * static_cast<int64_t>(sizeof(float)) *
               (1 + (p.trainable ? static_cast<int64_t>(m.state_kinds.size()) : 0));
    if (!p.trainable) {
      buffer.resize(static_cast<std::size_t>(p.numel));
      reader.read_frozen(id, buffer.data());
      reader.flush();
      writer.write(buffer.data(), p.numel);
      continue;
    }
    copy_range(reader, checkpoint::kParamsTensor, id, 0, p.numel, writer, buffer);
    for (const std::string& kind : m.state_kinds) copy_range(reader, kind, id, 0, p.numel, writer, buffer);
  }
  writer.commit();
  checkpoint::fsync_directory(parent_directory(out_file));
  if (progress) progress("export", total_bytes, total_bytes);
}

void reshard_checkpoint(const std::string& dir, const std::string& out_dir, const ReshardOptions& options,
                        const CheckpointProgress& progress) {
  SHARDOPT_CHECK(options.world_size >= 1, invalid_argument, "reshard: world size must be >= 1, got {}",
                 options.world_size);
  checkpoint::CheckpointReader reader = open_verified(dir, progress);
  const checkpoint::Manifest& old = reader.manifest();
  refuse_q8(old, dir, "reshard");
  partition::Strategy strategy = old.partition == partition::Strategy::replicated ? partition::Strategy::flat : old.partition;
  if (options.partition) {
    strategy = *options.partition == PartitionStrategy::flat ? partition::Strategy::flat
                                                             : partition::Strategy::sorted_greedy;
  }
  const std::vector<partition::ParamInfo> infos = checkpoint::layout_infos(old);
  // The alignment an optimizer uses, so the result equals what a save at that world size writes.
  const partition::Layout layout = partition::make_layout(strategy, infos, options.world_size, optim::kShardAlignment);

  checkpoint::make_directories(out_dir);
  checkpoint::Manifest next = old;
  next.format_version = checkpoint::kFormatVersion;
  // Resharding also upgrades a save made before moments were placed by algorithm.
  next.moments_by_algorithm = checkpoint::moment_kinds_differ(next);
  std::tie(next.generation, next.save_id) = checkpoint::next_save_identity(out_dir);
  next.world_size = options.world_size;
  next.partition = strategy;
  next.alignment = layout.alignment;
  next.files.clear();
  const int64_t frozen_numel = old.frozen_numel();
  std::vector<float> buffer;
  for (int f = 0; f < options.world_size; ++f) {
    if (progress) progress("reshard", f, options.world_size);
    const partition::RankShard& shard = layout.shards[static_cast<std::size_t>(f)];
    // The new files place moments as a save by an optimizer of these groups would.
    const optim::MomentLayout places = checkpoint::file_layout(next, shard);
    const checkpoint::FileMoments moments = checkpoint::file_moments(next, shard);
    checkpoint::ShardFileWriter writer(
        checkpoint::join_path(out_dir, checkpoint::shard_file_name(next.save_id, f, options.world_size)),
        checkpoint::shard_tensors(shard.numel, old.state_kinds, frozen_numel, f, moments),
        checkpoint::shard_metadata(next.save_id, f, options.world_size, moments.format));
    std::vector<std::string> tensors = {checkpoint::kParamsTensor};
    tensors.insert(tensors.end(), old.state_kinds.begin(), old.state_kinds.end());
    for (const std::string& tensor : tensors) {
      // "params": by shard offset, as the master.
      const std::size_t kind = tensor == checkpoint::kParamsTensor ? optim::kMaster : optim::state_kind_index(tensor);
      // Each segment the kind keeps, in the order of its place in the tensor.
      std::vector<std::pair<int64_t, const partition::Segment*>> pieces;
      for (std::size_t i = 0; i < shard.segments.size(); ++i) {
        const int64_t at = places.places[i].offset[kind];
        if (shard.segments[i].length > 0 && at >= 0) pieces.emplace_back(at, &shard.segments[i]);
      }
      std::sort(pieces.begin(), pieces.end());
      int64_t written = 0;
      for (const auto& [at, s] : pieces) {
        writer.write_zeros(at - written);
        copy_range(reader, tensor, s->param, s->param_offset, s->length, writer, buffer);
        written = at + s->length;
      }
      writer.write_zeros(moments.numel[kind] - written);
    }
    if (f == 0) {
      for (std::size_t i = 0; i < old.params.size(); ++i) {
        if (old.params[i].trainable) continue;
        buffer.resize(static_cast<std::size_t>(old.params[i].numel));
        reader.read_frozen(static_cast<int32_t>(i), buffer.data());
        reader.flush();
        writer.write(buffer.data(), old.params[i].numel);
      }
    }
    checkpoint::ManifestFile file = writer.commit();
    file.shard_numel = shard.numel;
    file.segments = shard.segments;
    next.files.push_back(std::move(file));
  }
  // The same proof a save makes before it commits.
  checkpoint::check_manifest(next, checkpoint::join_path(out_dir, checkpoint::kManifestName) + " (about to be written)");
  checkpoint::CheckpointReader written(out_dir, next);
  checkpoint::check_checkpoint_files(written);
  checkpoint::commit_manifest(out_dir, next);
  checkpoint::remove_unreferenced_files(out_dir, next);
  if (progress) progress("reshard", options.world_size, options.world_size);
}

bool upgrade_checkpoint(const std::string& dir, const CheckpointProgress& progress) {
  checkpoint::Manifest m = checkpoint::read_manifest(dir, /*accept_version_1=*/true);
  // Every check but the manifest's own checksum, which version 1 lacks: every shard file must
  // match the sizes, headers and CRC32Cs the old manifest states before it is vouched for.
  checkpoint::CheckpointReader reader(dir, m);
  checkpoint::check_checkpoint_files(reader, checkpoint::FileShare{}, progress);
  if (m.format_version == checkpoint::kFormatVersion) return false;
  m.format_version = checkpoint::kFormatVersion;
  checkpoint::commit_manifest(dir, m);
  return true;
}

}  // namespace shardopt
