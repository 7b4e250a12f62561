// tests/checkpoint/corpus_edit.hpp — CorpusDir: the byte, text and JSON edits that turn a copy of a base checkpoint into a mutant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace shardopt_test {

class CorpusDir {
 public:
  // `dir`: the copy to mutate; `other`: another save of the same model (its own directory).
  CorpusDir(std::string dir, std::string other) : dir_(std::move(dir)), other_(std::move(other)) {}

  std::string manifest_path() const { return dir_ + "/manifest.json"; }
  std::string shard_path(int index) const;
  std::string other_shard_path(int index) const;
  const std::string& dir() const { return dir_; }

  // Raw bytes: flips bit `bit` of the byte at `offset` (from the end when negative).
  void flip_bit(const std::string& path, int64_t offset, int bit) const;
  // The byte offset of the first occurrence of `text` in the file, plus `plus`; throws if absent.
  int64_t offset_of(const std::string& path, const std::string& text, int64_t plus = 0) const;
  // Replaces the first occurrence of `from` (which must occur) by `to`, checksums untouched.
  void replace_text(const std::string& path, const std::string& from, const std::string& to) const;

  // Manifest edits that recompute its checksum: as JSON, or as text (for what JSON cannot
  // hold, like a duplicate key).
  void edit_manifest(const std::function<void(nlohmann::ordered_json&)>& edit) const;
  void edit_manifest_text(const std::function<void(std::string&)>& edit) const;

  // Shard file edits that recompute its CRC32C and size in the manifest and the manifest's
  // checksum. As JSON (the header written back compactly, as the writer does, padded to 8
  // bytes), or with the header as text, or the whole file as bytes.
  void edit_shard(int index, const std::function<void(nlohmann::ordered_json& header, std::string& data)>& edit) const;
  void edit_shard_text(int index, const std::function<void(std::string& header, std::string& data)>& edit) const;
  void replace_shard_sealed(int index, const std::string& bytes) const;

 private:
  std::string dir_;
  std::string other_;
};

// [begin, end) of tensor `name` in a parsed safetensors header.
std::pair<int64_t, int64_t> offsets_of(const nlohmann::ordered_json& header, const std::string& name);
void set_offsets(nlohmann::ordered_json& header, const std::string& name, int64_t begin, int64_t end);

}  // namespace shardopt_test
