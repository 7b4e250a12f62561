// src/checkpoint/store.cpp — CheckpointReader, ShardFileWriter and the manifest commit of every save.
#include "checkpoint/store.hpp"

#include <algorithm>
#include <cstdlib>
#include <random>

#include <fmt/ranges.h>

#include "core/check.hpp"
#include "q8_state.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

void check_size(const std::string& path, int64_t size, int64_t expected) {
  SHARDOPT_CHECK(size == expected, corrupt, "shard file '{}' has {} bytes but the manifest says {} ({})", path, size,
                 expected, size < expected ? "truncated" : "extra bytes");
}

}  // namespace

// ---- CheckpointReader -------------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string dir, Manifest manifest)
    : dir_(std::move(dir)), manifest_(std::move(manifest)) {
  pieces_.resize(manifest_.params.size());
  for (std::size_t f = 0; f < manifest_.files.size(); ++f) {
    const ManifestFile& file = manifest_.files[f];
    moments_.push_back(file_moments(manifest_, f));
    const optim::MomentLayout places = file_layout(manifest_, partition::RankShard{0, file.shard_numel, file.segments});
    for (std::size_t k = 0; k < file.segments.size(); ++k) {
      const partition::Segment& s = file.segments[k];
      if (s.length > 0) pieces_[static_cast<std::size_t>(s.param)].push_back(Piece{f, &s, places.places[k]});
    }
  }
  for (auto& list : pieces_) {
    std::sort(list.begin(), list.end(),
              [](const Piece& a, const Piece& b) { return a.segment->param_offset < b.segment->param_offset; });
  }
  frozen_offset_.assign(manifest_.params.size(), -1);
  int64_t frozen = 0;
  for (std::size_t i = 0; i < manifest_.params.size(); ++i) {
    if (manifest_.params[i].trainable) continue;
    frozen_offset_[i] = frozen;
    frozen += manifest_.params[i].numel;
  }
  files_.resize(manifest_.files.size());
  headers_.resize(manifest_.files.size());
}

std::string CheckpointReader::file_path(std::size_t file) const {
  return join_path(dir_, manifest_.files[file].name);
}

void CheckpointReader::check_present(std::size_t file) const {
  const std::string path = file_path(file);
  const int64_t size = file_size_or_missing(path);
  SHARDOPT_CHECK(size >= 0, io, "checkpoint '{}': shard file '{}' is missing", dir_, path);
  check_size(path, size, manifest_.files[file].bytes);
}

InputFile& CheckpointReader::input(std::size_t file) {
  if (!files_[file]) files_[file] = std::make_unique<InputFile>(file_path(file));
  return *files_[file];
}

void CheckpointReader::check_header(std::size_t file) {
  if (headers_[file]) return;
  check_size(file_path(file), input(file).size(), manifest_.files[file].bytes);
  try {
    headers_[file] = parse_header(file);
  } catch (const Error& e) {
    // A header that fails its checks in a file whose bytes changed since the save is reported
    // as the corruption it is (one flipped bit turns "F32" into an unsupported dtype), and
    // every rank that reads this header, whatever its share, reaches the same verdict.
    const std::string mismatch = checksum_mismatch(file);
    SHARDOPT_CHECK(mismatch.empty(), corrupt, "{} (and its header fails its checks: {})", mismatch, e.what());
    throw;
  }
}

SafetensorsHeader CheckpointReader::parse_header(std::size_t file) {
  const std::string path = file_path(file);
  const ManifestFile& f = manifest_.files[file];
  SafetensorsHeader header = read_safetensors_header(input(file), f.bytes);
  const int count = static_cast<int>(manifest_.files.size());
  for (const auto& [key, want] :
       shard_metadata(manifest_.save_id, static_cast<int>(file), count, moments_[file].format)) {
    const auto got = header.metadata.find(key);
    SHARDOPT_CHECK(key != "save_id" || (got != header.metadata.end() && got->second == want), corrupt,
                   "'{}' belongs to another save than the manifest's ('{}')", path, want);
    SHARDOPT_CHECK(got != header.metadata.end() && got->second == want, corrupt,
                   "'{}': its metadata '{}' is '{}', but as file {} of {} of this save it must be '{}'", path, key,
                   got == header.metadata.end() ? std::string("(absent)") : got->second, file, count, want);
  }
  for (const auto& [key, value] : header.metadata) {
    SHARDOPT_CHECK(shard_metadata(manifest_.save_id, 0, 1).count(key) == 1, corrupt,
                   "'{}': unexpected metadata '{}' ('{}')", path, key, value);
  }
  const std::vector<TensorEntry> expected = shard_tensors(f.shard_numel, manifest_.state_kinds,
                                                         manifest_.frozen_numel(), static_cast<int>(file), moments_[file]);
  for (const TensorEntry& e : expected) {
    const TensorEntry* t = header.find(e.name);
    SHARDOPT_CHECK(t != nullptr, corrupt, "'{}' has no tensor '{}' (the manifest says it should)", path, e.name);
    SHARDOPT_CHECK(t->shape == e.shape, corrupt, "'{}': tensor '{}' has shape [{}], the manifest says [{}]", path, e.name,
                   fmt::join(t->shape, ", "), fmt::join(e.shape, ", "));
    SHARDOPT_CHECK(t->dtype == e.dtype, corrupt, "'{}': tensor '{}' is {}, the manifest says {}", path, e.name,
                   dtype_name(t->dtype), dtype_name(e.dtype));
  }
  for (const TensorEntry& t : header.tensors) {
    const bool named = std::any_of(expected.begin(), expected.end(), [&](const TensorEntry& e) { return e.name == t.name; });
    SHARDOPT_CHECK(named, corrupt, "'{}' holds tensor '{}', which the manifest does not name", path, t.name);
  }
  return header;
}

std::string CheckpointReader::checksum_mismatch(std::size_t file) {
  const uint32_t crc = input(file).crc32c_of_all(manifest_.files[file].bytes);
  if (crc == manifest_.files[file].crc32c) return "";
  return fmt::format("checkpoint '{}': shard file '{}' is corrupt: CRC32C {:08x}, the manifest says {:08x}", dir_,
                     file_path(file), crc, manifest_.files[file].crc32c);
}

void CheckpointReader::verify_checksum(std::size_t file) {
  const std::string mismatch = checksum_mismatch(file);
  SHARDOPT_CHECK(mismatch.empty(), corrupt, "{}", mismatch);
}

bool CheckpointReader::has_tensor(const std::string& tensor) const {
  const bool q8_tensor = tensor == kQ8CodesTensor[0] || tensor == kQ8CodesTensor[1] || tensor == kQ8AbsmaxTensor[0] ||
                         tensor == kQ8AbsmaxTensor[1];
  if (q8_tensor) return any_q8(manifest_);
  return tensor == kParamsTensor ||
         std::find(manifest_.state_kinds.begin(), manifest_.state_kinds.end(), tensor) != manifest_.state_kinds.end();
}

int64_t CheckpointReader::tensor_start(std::size_t file, const std::string& tensor) {
  check_header(file);
  const TensorEntry* t = headers_[file]->find(tensor);
  SHARDOPT_CHECK(t != nullptr, corrupt, "'{}' has no tensor '{}'", file_path(file), tensor);
  return headers_[file]->data_start + t->begin;
}

void CheckpointReader::enqueue(std::size_t file, int64_t file_offset, void* out, std::size_t bytes) {
  if (bytes == 0) return;
  char* dest = static_cast<char*>(out);
  if (!queue_.empty()) {
    Request& last = queue_.back();
    if (last.file == file && last.file_offset + static_cast<int64_t>(last.bytes) == file_offset &&
        last.out + last.bytes == dest) {
      last.bytes += bytes;
      return;
    }
  }
  queue_.push_back(Request{file, file_offset, dest, bytes});
}

void CheckpointReader::read_param_range(const std::string& tensor, int32_t param, int64_t offset, int64_t length,
                                        float* out) {
  SHARDOPT_CHECK(has_tensor(tensor), internal, "checkpoint '{}' holds no '{}'", dir_, tensor);
  const int64_t end = offset + length;
  int64_t covered = offset;
  // Where the file keeps the tensor's elements (FileMoments); "params" as the master, by shard offset.
  const std::size_t kind = tensor == kParamsTensor ? optim::kMaster : optim::state_kind_index(tensor);
  SHARDOPT_CHECK(kind < optim::kStateKinds, internal, "checkpoint '{}': '{}' is not read by parameter range", dir_, tensor);
  for (const Piece& piece : pieces_[static_cast<std::size_t>(param)]) {
    const partition::Segment& s = *piece.segment;
    const int64_t lo = std::max(offset, s.param_offset);
    const int64_t hi = std::min(end, s.param_offset + s.length);
    if (lo >= hi) continue;
    SHARDOPT_CHECK(kind == optim::kMaster || !piece.place.q8, internal, "checkpoint '{}': '{}' of parameter #{} is 8-bit",
                   dir_, tensor, param);
    covered += hi - lo;
    if (piece.place.offset[kind] < 0) {
      // The file keeps no such state for this param (its algorithm has none): zeros, as a
      // state kind that was never written holds.
      std::fill(out + (lo - offset), out + (hi - offset), 0.f);
      continue;
    }
    const int64_t element = piece.place.offset[kind] + (lo - s.param_offset);
    enqueue(piece.file, tensor_start(piece.file, tensor) + element * static_cast<int64_t>(sizeof(float)),
            out + (lo - offset), static_cast<std::size_t>(hi - lo) * sizeof(float));
  }
  // The manifest's segments tile every trainable param (checked when it was parsed).
  SHARDOPT_CHECK(covered == end, internal, "checkpoint '{}': parameter #{} elements [{}, {}) not found", dir_, param,
                 offset, end);
}

void CheckpointReader::read_q8(int32_t param, std::size_t m, uint8_t* codes, float* absmax) {
  const std::vector<Piece>& pieces = pieces_[static_cast<std::size_t>(param)];
  const ManifestParam& p = manifest_.params[static_cast<std::size_t>(param)];
  // The manifest's check keeps an 8-bit parameter in one segment.
  SHARDOPT_CHECK(p.q8 && pieces.size() == 1 && pieces[0].place.q8, internal,
                 "checkpoint '{}': parameter '{}' has no 8-bit moments", dir_, p.name);
  const Piece& piece = pieces[0];
  enqueue(piece.file, tensor_start(piece.file, kQ8CodesTensor[m]) + piece.place.code_offset, codes,
          static_cast<std::size_t>(p.numel));
  enqueue(piece.file,
          tensor_start(piece.file, kQ8AbsmaxTensor[m]) + piece.place.block_offset * static_cast<int64_t>(sizeof(float)),
          absmax, static_cast<std::size_t>(kernels::q8_blocks(p.numel)) * sizeof(float));
}

void CheckpointReader::read_frozen(int32_t param, float* out) {
  const ManifestParam& p = manifest_.params[static_cast<std::size_t>(param)];
  SHARDOPT_CHECK(!p.trainable, internal, "parameter '{}' is not frozen in the checkpoint", p.name);
  enqueue(0, tensor_start(0, kFrozenTensor) + frozen_offset_[static_cast<std::size_t>(param)] * static_cast<int64_t>(sizeof(float)), out,
          static_cast<std::size_t>(p.numel) * sizeof(float));
}

void CheckpointReader::read_frozen_range(int32_t param, int64_t offset, int64_t length, float* out) {
  const ManifestParam& p = manifest_.params[static_cast<std::size_t>(param)];
  SHARDOPT_CHECK(!p.trainable, internal, "parameter '{}' is not frozen in the checkpoint", p.name);
  SHARDOPT_CHECK(offset >= 0 && length >= 0 && offset + length <= p.numel, internal,
                 "frozen parameter '{}': elements [{}, {}) of {}", p.name, offset, offset + length, p.numel);
  const int64_t element = frozen_offset_[static_cast<std::size_t>(param)] + offset;
  enqueue(0, tensor_start(0, kFrozenTensor) + element * static_cast<int64_t>(sizeof(float)), out,
          static_cast<std::size_t>(length) * sizeof(float));
}

void CheckpointReader::flush() {
  std::vector<Request> queue;
  queue.swap(queue_);
  for (const Request& r : queue) input(r.file).read_at(r.file_offset, r.out, r.bytes);
}

// ---- ShardFileWriter --------------------------------------------------------------------------

ShardFileWriter::ShardFileWriter(const std::string& path, std::vector<TensorEntry> tensors,
                                 const std::map<std::string, std::string>& metadata)
    : file_(path) {
  const std::string header = encode_safetensors_header(tensors, metadata);
  file_.write(header.data(), header.size());
  expected_bytes_ = static_cast<int64_t>(header.size()) + (tensors.empty() ? 0 : tensors.back().end);
}

void ShardFileWriter::write(const float* data, int64_t count) {
  if (count > 0) file_.write(data, static_cast<std::size_t>(count) * sizeof(float));
}

void ShardFileWriter::write_bytes(const void* data, int64_t bytes) {
  if (bytes > 0) file_.write(data, static_cast<std::size_t>(bytes));
}

void ShardFileWriter::write_zeros(int64_t count) {
  if (count > 0) file_.write_zeros(static_cast<std::size_t>(count) * sizeof(float));
}

ManifestFile ShardFileWriter::commit() {
  SHARDOPT_CHECK(file_.bytes() == expected_bytes_, internal, "'{}': wrote {} bytes, the header promises {}",
                 file_.path(), file_.bytes(), expected_bytes_);
  file_.commit();
  ManifestFile f;
  const std::size_t slash = file_.path().rfind('/');
  f.name = slash == std::string::npos ? file_.path() : file_.path().substr(slash + 1);
  f.bytes = file_.bytes();
  f.crc32c = file_.crc32c();
  return f;
}

FileMoments FileMoments::whole_shard(int64_t shard_numel) {
  FileMoments out;
  out.numel.fill(shard_numel);
  return out;
}

std::vector<optim::StateMask> moment_holders(const Manifest& manifest) {
  std::vector<optim::StateMask> holds;
  if (!manifest.moments_by_algorithm) return holds;
  for (const ManifestParam& p : manifest.params) {
    holds.push_back(optim::algorithm_kinds(group_algorithm(manifest, static_cast<std::size_t>(p.group))));
  }
  return holds;
}

bool moment_kinds_differ(const Manifest& manifest) {
  auto kinds_of = [&](const ManifestParam& p) {
    return optim::algorithm_kinds(group_algorithm(manifest, static_cast<std::size_t>(p.group)));
  };
  return std::any_of(manifest.params.begin(), manifest.params.end(),
                     [&](const ManifestParam& p) { return kinds_of(p) != kinds_of(manifest.params.front()); });
}

optim::MomentLayout file_layout(const Manifest& manifest, const partition::RankShard& shard) {
  return optim::place_moments(shard, q8_params(manifest), moment_holders(manifest));
}

FileMoments file_moments(const Manifest& manifest, const partition::RankShard& shard) {
  const optim::MomentLayout layout = file_layout(manifest, shard);
  FileMoments out;
  out.format = manifest.moments_by_algorithm ? kShardFormatVersionByAlgorithm
               : layout.code_numel > 0       ? kShardFormatVersionQ8
                                             : kShardFormatVersion;
  out.numel = layout.numel;
  out.code_numel = layout.code_numel;
  out.blocks = layout.blocks;
  return out;
}

FileMoments file_moments(const Manifest& manifest, std::size_t file) {
  const ManifestFile& f = manifest.files[file];
  return file_moments(manifest, partition::RankShard{0, f.shard_numel, f.segments});
}

std::vector<TensorEntry> shard_tensors(int64_t shard_numel, const std::vector<std::string>& state_kinds,
                                       int64_t frozen_numel, int index, const FileMoments& moments) {
  std::vector<TensorEntry> tensors;
  tensors.push_back(TensorEntry{kParamsTensor, {shard_numel}, 0, 0});
  for (const std::string& kind : state_kinds) {
    const std::size_t k = optim::state_kind_index(kind);
    SHARDOPT_CHECK(k < optim::kStateKinds, internal, "shard_tensors: '{}' is not a state kind", kind);
    tensors.push_back(TensorEntry{kind, {moments.numel[k]}, 0, 0});
  }
  if (index == 0 && frozen_numel > 0) tensors.push_back(TensorEntry{kFrozenTensor, {frozen_numel}, 0, 0});
  if (moments.q8()) {
    // Codes last: the F32 tensors before them stay 4-byte aligned in the file.
    for (const char* name : kQ8AbsmaxTensor) tensors.push_back(TensorEntry{name, {moments.blocks}, 0, 0});
    for (const char* name : kQ8CodesTensor) tensors.push_back(TensorEntry{name, {moments.code_numel}, 0, 0, DType::byte});
  }
  return tensors;
}

std::map<std::string, std::string> shard_metadata(const std::string& save_id, int index, int count, int format) {
  return {{"format", "shardopt-shard"},
          {"format_version", std::to_string(format)},
          {"save_id", save_id},
          {"file_index", std::to_string(index)},
          {"num_files", std::to_string(count)}};
}

// ---- saves ------------------------------------------------------------------------------------

std::pair<uint64_t, std::string> next_save_identity(const std::string& dir) {
  uint64_t generation = 1;
  try {
    generation = read_manifest(dir).generation + 1;
  } catch (const Error&) {
    // No (readable) previous checkpoint: this is the first generation.
  }
  std::random_device device;
  const uint32_t token = device();
  return {generation, fmt::format("g{:06d}-{:08x}", generation, token)};
}

void commit_manifest(const std::string& dir, const Manifest& manifest) {
  fsync_directory(dir);
  const std::string text = manifest_to_json(manifest);
  const std::string path = join_path(dir, kManifestName);
  AtomicFileWriter file(path);
  file.write(text.data(), text.size());
  file.commit();
  fsync_directory(dir);
  // Read back before anything older is removed: what a load will read is what was written.
  SHARDOPT_CHECK(read_whole_file(path) == text, io, "'{}' reads back other bytes than were written", path);
  parse_manifest(text, path);
}

void remove_unreferenced_files(const std::string& dir, const Manifest& manifest) {
  try {
    for (const std::string& name : list_directory(dir)) {
      if (!is_checkpoint_file_name(name)) continue;
      const bool referenced = std::any_of(manifest.files.begin(), manifest.files.end(),
                                          [&](const ManifestFile& f) { return f.name == name; });
      if (!referenced) remove_file_if_present(join_path(dir, name));
    }
  } catch (const Error&) {
    // Leftovers cost disk space only; the new checkpoint is complete either way.
  }
}

bool test_abort_requested(const char* point) {
  const char* value = std::getenv("SHARDOPT_TEST_ABORT_SAVE_AFTER");
  return value != nullptr && std::string(value) == point;
}

bool test_damage_requested(int rank) {
  const char* value = std::getenv("SHARDOPT_TEST_DAMAGE_SHARD_OF_RANK");
  return value != nullptr && std::string(value) == std::to_string(rank);
}

}  // namespace checkpoint
}  // namespace shardopt
