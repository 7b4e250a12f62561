// tests/checkpoint/corpus_edit.cpp — byte, text and JSON edits of checkpoint files, with or without resealing their checksums.
#include "corpus_edit.hpp"

#include <stdexcept>

#include "ckpt_test_support.hpp"

namespace shardopt_test {
namespace {

std::string nth_shard(const std::string& dir, int index) {
  const std::vector<std::string> names = shard_files(dir);
  if (index < 0 || static_cast<std::size_t>(index) >= names.size()) throw std::runtime_error("no shard file " + std::to_string(index));
  return dir + "/" + names[static_cast<std::size_t>(index)];
}

// Writes `bytes` as shard file `index` and records its size and CRC32C in the manifest, sealed.
void write_shard_sealed(const CorpusDir& d, int index, const std::string& bytes) {
  write_bytes(d.shard_path(index), bytes);
  d.edit_manifest([&](nlohmann::ordered_json& m) {
    m["files"][static_cast<std::size_t>(index)]["bytes"] = bytes.size();
    m["files"][static_cast<std::size_t>(index)]["crc32c"] = crc32c_of(bytes);
  });
}

}  // namespace

std::string CorpusDir::shard_path(int index) const { return nth_shard(dir_, index); }
std::string CorpusDir::other_shard_path(int index) const { return nth_shard(other_, index); }

void CorpusDir::flip_bit(const std::string& path, int64_t offset, int bit) const {
  std::string bytes = file_bytes(path);
  const int64_t at = offset < 0 ? static_cast<int64_t>(bytes.size()) + offset : offset;
  if (at < 0 || at >= static_cast<int64_t>(bytes.size())) throw std::runtime_error("flip_bit: offset outside " + path);
  bytes[static_cast<std::size_t>(at)] = static_cast<char>(bytes[static_cast<std::size_t>(at)] ^ (1 << bit));
  write_bytes(path, bytes);
}

int64_t CorpusDir::offset_of(const std::string& path, const std::string& text, int64_t plus) const {
  const std::size_t at = file_bytes(path).find(text);
  if (at == std::string::npos) throw std::runtime_error("offset_of: '" + text + "' not in " + path);
  return static_cast<int64_t>(at) + plus;
}

void CorpusDir::replace_text(const std::string& path, const std::string& from, const std::string& to) const {
  std::string bytes = file_bytes(path);
  const std::size_t at = bytes.find(from);
  if (at == std::string::npos) throw std::runtime_error("replace_text: '" + from + "' not in " + path);
  bytes.replace(at, from.size(), to);
  write_bytes(path, bytes);
}

void CorpusDir::edit_manifest(const std::function<void(nlohmann::ordered_json&)>& edit) const {
  nlohmann::ordered_json j = manifest_json(file_bytes(manifest_path()));
  edit(j);
  write_bytes(manifest_path(), sealed_manifest_text(j));
}

void CorpusDir::edit_manifest_text(const std::function<void(std::string&)>& edit) const {
  std::string body = manifest_json(file_bytes(manifest_path())).dump(1);
  edit(body);
  write_bytes(manifest_path(), seal_manifest(body));
}

void CorpusDir::edit_shard(int index,
                           const std::function<void(nlohmann::ordered_json& header, std::string& data)>& edit) const {
  edit_shard_text(index, [&](std::string& header, std::string& data) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(header);
    edit(j, data);
    header = j.dump();
  });
}

void CorpusDir::edit_shard_text(int index, const std::function<void(std::string& header, std::string& data)>& edit) const {
  ShardBytes shard = split_shard(file_bytes(shard_path(index)));
  edit(shard.header, shard.data);
  write_shard_sealed(*this, index, join_shard(shard.header, shard.data));
}

void CorpusDir::replace_shard_sealed(int index, const std::string& bytes) const { write_shard_sealed(*this, index, bytes); }

std::pair<int64_t, int64_t> offsets_of(const nlohmann::ordered_json& header, const std::string& name) {
  const auto& o = header.at(name).at("data_offsets");
  return {o[0].get<int64_t>(), o[1].get<int64_t>()};
}

void set_offsets(nlohmann::ordered_json& header, const std::string& name, int64_t begin, int64_t end) {
  header[name]["data_offsets"] = {begin, end};
}

}  // namespace shardopt_test
