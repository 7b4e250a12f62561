// src/averaging/outer_state_file.cpp — the outer optimizer's state files: written with their layout, checked against the replica checkpoint's parameters, mapped onto the loading layout by parameter and element range.
#include "averaging/outer_state_file.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/file_io.hpp"
#include "checkpoint/json_reader.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/store.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace averaging {

namespace {

using checkpoint::join_path;

constexpr const char* kFormat = "shardopt-outer-optimizer";
constexpr const char* kTensors[] = {"anchor", "momentum"};

// Every registered parameter as [name, numel, trainable]; the shard's segments as
// [param, param_offset, shard_offset, length].
std::string params_json(const std::vector<optim::ParamRecord>& params) {
  nlohmann::json out = nlohmann::json::array();
  for (const optim::ParamRecord& p : params) out.push_back({p.name, p.numel, p.trainable});
  return out.dump();
}

std::string segments_json(const partition::RankShard& shard) {
  nlohmann::json out = nlohmann::json::array();
  for (const partition::Segment& s : shard.segments) {
    if (s.length > 0) out.push_back({s.param, s.param_offset, s.shard_offset, s.length});
  }
  return out.dump();
}

const std::string& metadata(const checkpoint::SafetensorsHeader& header, const std::string& path,
                            const std::string& key) {
  const auto it = header.metadata.find(key);
  SHARDOPT_CHECK(it != header.metadata.end(), corrupt,
                 "load: '{}' does not record '{}' (the layout its outer-optimizer state follows)", path, key);
  return it->second;
}

// The saved parameters must be the replica checkpoint's, name for name.
void check_params(const std::string& path, const std::string& text,
                  const std::vector<checkpoint::ManifestParam>& params) {
  const nlohmann::json saved = checkpoint::parse_json_strict(text, path, "outer-optimizer parameter list");
  SHARDOPT_CHECK(saved.is_array() && saved.size() == params.size(), mismatch,
                 "load: '{}' holds the outer optimizer's state of {} parameters, the replica checkpoint {}", path,
                 saved.is_array() ? saved.size() : 0, params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const nlohmann::json& p = saved[i];
    const std::string field = fmt::format("params[{}]", i);
    SHARDOPT_CHECK(p.is_array() && p.size() == 3 && p[0].is_string() && p[2].is_boolean(), corrupt,
                   "load: '{}': {} is not [name, numel, trainable]", path, field);
    const std::string name = p[0].get<std::string>();
    const int64_t numel = checkpoint::json_integer(p[1], 0, partition::kMaxElements, path, field + ".numel");
    const bool trainable = p[2].get<bool>();
    SHARDOPT_CHECK(name == params[i].name && numel == params[i].numel, mismatch,
                   "load: '{}' holds the outer optimizer's state of parameter {} '{}' ({} elements); the replica "
                   "checkpoint's parameter {} is '{}' ({} elements)",
                   path, i, name, numel, i, params[i].name, params[i].numel);
    SHARDOPT_CHECK(trainable == params[i].trainable, corrupt,
                   "load: '{}' was saved with parameter '{}' {}, the replica checkpoint has it {}", path, name,
                   trainable ? "trainable" : "frozen", params[i].trainable ? "trainable" : "frozen");
  }
}

std::vector<partition::Segment> parse_segments(const std::string& path, const std::string& text, std::size_t params,
                                               int64_t shard_numel) {
  const nlohmann::json saved = checkpoint::parse_json_strict(text, path, "outer-optimizer segment list");
  SHARDOPT_CHECK(saved.is_array(), corrupt, "load: '{}': segments is not an array", path);
  std::vector<partition::Segment> out;
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const nlohmann::json& s = saved[i];
    const std::string field = fmt::format("segments[{}]", i);
    SHARDOPT_CHECK(s.is_array() && s.size() == 4, corrupt,
                   "load: '{}': {} is not [param, param_offset, shard_offset, length]", path, field);
    partition::Segment seg;
    seg.param = static_cast<int32_t>(
        checkpoint::json_integer(s[0], 0, static_cast<int64_t>(params) - 1, path, field + ".param"));
    seg.param_offset = checkpoint::json_integer(s[1], 0, partition::kMaxElements, path, field + ".param_offset");
    seg.shard_offset = checkpoint::json_integer(s[2], 0, shard_numel, path, field + ".shard_offset");
    seg.length = checkpoint::json_integer(s[3], 1, shard_numel - seg.shard_offset, path, field + ".length");
    out.push_back(seg);
  }
  return out;
}

// Every trainable parameter's elements exactly once over all files, frozen ones not at all.
void check_tiling(const SavedOuterState& saved, const std::vector<checkpoint::ManifestParam>& params,
                  const std::string& dir) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    int64_t next = 0;
    for (const SavedOuterState::Piece& piece : saved.by_param[i]) {
      SHARDOPT_CHECK(piece.segment.param_offset == next, corrupt,
                     "load: the outer optimizer's state in '{}' holds elements [{}, {}) of parameter '{}' where "
                     "element {} comes next ({})",
                     dir, piece.segment.param_offset, piece.segment.param_offset + piece.segment.length,
                     params[i].name, next, saved.paths[piece.file]);
      next += piece.segment.length;
    }
    const int64_t want = params[i].trainable ? params[i].numel : 0;
    SHARDOPT_CHECK(next == want, corrupt,
                   "load: the outer optimizer's state in '{}' holds {} elements of parameter '{}' ({}), expected {}",
                   dir, next, params[i].name, params[i].trainable ? "trainable" : "frozen", want);
  }
}

}  // namespace

OuterFile write_outer_file(const OuterState& state, const std::vector<optim::ParamRecord>& params, const partition::RankShard& shard,
                           int local_rank, const std::string& dir, const std::string& name) {
  const int64_t n = static_cast<int64_t>(state.anchor.size());
  SHARDOPT_CHECK(n == shard.numel && state.momentum.size() == state.anchor.size(), internal,
                 "save: the outer optimizer's state has {} elements, this rank's shard {}", n, shard.numel);
  std::vector<checkpoint::TensorEntry> tensors{{kTensors[0], {n}, 0, 0}, {kTensors[1], {n}, 0, 0}};
  checkpoint::ShardFileWriter writer(join_path(dir, name), tensors,
                                     {{"format", kFormat},
                                      {"local_rank", std::to_string(local_rank)},
                                      {"params", params_json(params)},
                                      {"segments", segments_json(shard)}});
  writer.write(state.anchor.data(), n);
  writer.write(state.momentum.data(), n);
  const checkpoint::ManifestFile written = writer.commit();
  return OuterFile{name, written.bytes, written.crc32c};
}

SavedOuterState read_outer_layout(const std::string& dir, const std::vector<OuterFile>& files,
                                  const std::vector<checkpoint::ManifestParam>& params, bool verify_checksums) {
  SavedOuterState saved;
  saved.by_param.resize(params.size());
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string path = join_path(dir, files[f].name);
    const int64_t size = checkpoint::file_size_or_missing(path);
    SHARDOPT_CHECK(size >= 0, io, "load: '{}' is missing", path);
    SHARDOPT_CHECK(size == files[f].bytes, corrupt, "load: '{}' has {} bytes, the record says {}", path, size,
                   files[f].bytes);
    const checkpoint::InputFile in(path);
    if (verify_checksums) {
      const uint32_t crc = in.crc32c_of_all(size);
      SHARDOPT_CHECK(crc == files[f].crc32c, corrupt, "load: '{}' fails its checksum (CRC32C {:08x}, recorded {:08x})",
                     path, crc, files[f].crc32c);
    }
    const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(in, size);
    SHARDOPT_CHECK(metadata(header, path, "format") == kFormat, corrupt, "load: '{}' is not a {} file", path, kFormat);
    const checkpoint::TensorEntry* anchor = header.find(kTensors[0]);
    const checkpoint::TensorEntry* momentum = header.find(kTensors[1]);
    SHARDOPT_CHECK(anchor != nullptr && momentum != nullptr && anchor->shape.size() == 1 &&
                       momentum->shape == anchor->shape,
                   corrupt, "load: '{}' must hold 'anchor' and 'momentum' of one shard's elements each", path);
    check_params(path, metadata(header, path, "params"), params);
    for (const partition::Segment& s :
         parse_segments(path, metadata(header, path, "segments"), params.size(), anchor->numel())) {
      saved.by_param[static_cast<std::size_t>(s.param)].push_back(SavedOuterState::Piece{f, s});
    }
    saved.paths.push_back(path);
    saved.anchor_start.push_back(header.data_start + anchor->begin);
    saved.momentum_start.push_back(header.data_start + momentum->begin);
  }
  for (std::vector<SavedOuterState::Piece>& pieces : saved.by_param) {
    std::sort(pieces.begin(), pieces.end(), [](const SavedOuterState::Piece& a, const SavedOuterState::Piece& b) {
      return a.segment.param_offset < b.segment.param_offset;
    });
  }
  check_tiling(saved, params, dir);
  return saved;
}

void map_outer_state(const SavedOuterState& saved, const std::vector<optim::ParamRecord>& params, const partition::RankShard& shard,
                     OuterState& into) {
  const std::size_t numel = static_cast<std::size_t>(shard.numel);
  into.anchor.assign(numel, 0.f);
  into.momentum.assign(numel, 0.f);
  std::vector<std::unique_ptr<checkpoint::InputFile>> open(saved.paths.size());
  for (const partition::Segment& want : shard.segments) {
    const std::size_t param = static_cast<std::size_t>(want.param);
    const int64_t end = want.param_offset + want.length;
    int64_t covered = 0;
    for (const SavedOuterState::Piece& piece : saved.by_param.at(param)) {
      const partition::Segment& have = piece.segment;
      const int64_t from = std::max(want.param_offset, have.param_offset);
      const int64_t to = std::min(end, have.param_offset + have.length);
      if (from >= to) continue;
      if (!open[piece.file]) open[piece.file] = std::make_unique<checkpoint::InputFile>(saved.paths[piece.file]);
      const int64_t saved_at = have.shard_offset + (from - have.param_offset);   // in the saved shard
      const std::size_t into_at = static_cast<std::size_t>(want.shard_offset + (from - want.param_offset));
      const std::size_t bytes = static_cast<std::size_t>(to - from) * sizeof(float);
      const int64_t byte_offset = saved_at * static_cast<int64_t>(sizeof(float));
      open[piece.file]->read_at(saved.anchor_start[piece.file] + byte_offset, into.anchor.data() + into_at, bytes);
      open[piece.file]->read_at(saved.momentum_start[piece.file] + byte_offset, into.momentum.data() + into_at, bytes);
      covered += to - from;
    }
    SHARDOPT_CHECK(covered == want.length, corrupt,
                   "load: the outer optimizer's state holds {} of the {} elements [{}, {}) of parameter '{}' this "
                   "rank's shard keeps",
                   covered, want.length, want.param_offset, end, params[param].name);
  }
}

}  // namespace averaging
}  // namespace shardopt
