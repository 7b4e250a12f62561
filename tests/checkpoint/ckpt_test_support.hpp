// tests/checkpoint/ckpt_test_support.hpp — what the checkpoint tests share: scratch directories, file bytes, resealing edited manifests and shard files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/crc32c.hpp"
#include "mpi_test_support.hpp"

namespace shardopt_test {

namespace fs = std::filesystem;

// A directory shared by the ranks of this run, fresh for each use: rank 0 clears it.
inline std::string scratch(const std::string& name) {
  const std::string dir = std::string(SHARDOPT_TEST_SCRATCH) + "/np" + std::to_string(world()->size()) + "/" + name;
  if (world()->rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world()->barrier();
  return dir;
}

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Changes one byte where it is, without truncating the file (rewriting a truncated file makes
// some filesystems flush it to disk on close, which thousands of edits cannot afford).
inline void poke_byte(const std::string& path, std::size_t at, char value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(value);
}

// The shard file names in `dir`, sorted (file 0 first).
inline std::vector<std::string> shard_files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline uint32_t crc32c_of(const std::string& bytes) {
  return shardopt::checkpoint::crc32c_update(0, bytes.data(), bytes.size());
}

// The manifest format's checksum, written independently of the library (a second reading of
// its specification, manifest.hpp): `body` is a JSON object's text ending in "\n}"; the result
// ends with the member "manifest_crc32c" holding the CRC32C of every byte before its digits.
inline std::string seal_manifest(std::string body) {
  while (!body.empty() && (body.back() == '\n' || body.back() == ' ')) body.pop_back();
  if (body.size() < 2 || body.compare(body.size() - 2, 2, "\n}") != 0) throw std::runtime_error("seal_manifest: no \\n}");
  body.resize(body.size() - 2);
  body += ",\n \"manifest_crc32c\": \"";
  return body + fmt::format("{:08x}", crc32c_of(body)) + "\"\n}\n";
}

// The manifest text as JSON (its checksum member dropped) and back, sealed again: what a
// hand edit that also recomputes the checksum produces.
inline nlohmann::ordered_json manifest_json(const std::string& text) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  j.erase("manifest_crc32c");
  return j;
}
inline std::string sealed_manifest_text(const nlohmann::ordered_json& j) { return seal_manifest(j.dump(1)); }

// A safetensors file split into its header (JSON) and data section, and joined again with the
// header padded to 8 bytes as the writer does.
struct ShardBytes {
  std::string header;  // the JSON text, padding included
  std::string data;
};
inline ShardBytes split_shard(const std::string& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return ShardBytes{bytes.substr(8, length), bytes.substr(8 + length)};
}
inline std::string join_shard(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t length = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);
  return out + header + data;
}

}  // namespace shardopt_test
