// src/checkpoint/safetensors.cpp — encoding and validating safetensors headers with nlohmann::json.
#include "checkpoint/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// The reference implementation refuses larger headers; so do we, before allocating one.
constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string encode_safetensors_header(std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (TensorEntry& t : tensors) {
    t.begin = offset;
    t.end = offset + t.numel() * static_cast<int64_t>(sizeof(float));
    offset = t.end;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t length = json.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &length, 8);  // little-endian host (file_io.hpp)
  return out + json;
}

const TensorEntry* SafetensorsHeader::find(const std::string& name) const {
  for (const TensorEntry& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

SafetensorsHeader read_safetensors_header(const InputFile& file, int64_t file_size) {
  const std::string& path = file.path();
  SHARDOPT_CHECK(file_size >= 8, corrupt, "'{}' is {} bytes, too short for a safetensors header", path, file_size);
  uint64_t length = 0;
  file.read_at(0, &length, 8);
  SHARDOPT_CHECK(length <= static_cast<uint64_t>(std::min(kMaxHeaderBytes, file_size - 8)), corrupt,
                 "'{}': the header length word says {} bytes but the file has {} bytes after it", path,
                 length, file_size - 8);
  std::string text(static_cast<std::size_t>(length), '\0');
  file.read_at(8, text.data(), text.size());

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(length);
  const int64_t data_bytes = file_size - header.data_start;
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}': the safetensors header is not valid JSON ({})", path, e.what());
  }
  SHARDOPT_CHECK(json.is_object(), corrupt, "'{}': the safetensors header is not a JSON object", path);
  int64_t data_end = 0;
  try {
    for (const auto& [name, value] : json.items()) {
      if (name == "__metadata__") {
        for (const auto& [key, v] : value.items()) header.metadata[key] = v.get<std::string>();
        continue;
      }
      const std::string dtype = value.at("dtype").get<std::string>();
      SHARDOPT_CHECK(dtype == "F32", unsupported, "'{}': tensor '{}' has dtype {}; shardopt checkpoints hold F32 only",
                     path, name, dtype);
      TensorEntry t;
      t.name = name;
      t.shape = value.at("shape").get<std::vector<int64_t>>();
      const auto offsets = value.at("data_offsets").get<std::vector<int64_t>>();
      SHARDOPT_CHECK(offsets.size() == 2, corrupt, "'{}': tensor '{}' needs two data_offsets", path, name);
      t.begin = offsets[0];
      t.end = offsets[1];
      for (int64_t d : t.shape) SHARDOPT_CHECK(d >= 0, corrupt, "'{}': tensor '{}' has a negative dimension", path, name);
      SHARDOPT_CHECK(0 <= t.begin && t.begin <= t.end && t.end <= data_bytes, corrupt,
                     "'{}': tensor '{}' claims bytes [{}, {}) but the data section has {} bytes (truncated?)",
                     path, name, t.begin, t.end, data_bytes);
      SHARDOPT_CHECK(t.end - t.begin == t.numel() * static_cast<int64_t>(sizeof(float)), corrupt,
                     "'{}': tensor '{}' spans {} bytes but its shape needs {}", path, name, t.end - t.begin,
                     t.numel() * static_cast<int64_t>(sizeof(float)));
      data_end = std::max(data_end, t.end);
      header.tensors.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    raise(ErrorCode::corrupt, "'{}': malformed safetensors header ({})", path, e.what());
  }
  SHARDOPT_CHECK(data_end == data_bytes, corrupt, "'{}': its tensors end at data byte {} but the file holds {} data bytes",
                 path, data_end, data_bytes);
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
  return header;
}

}  // namespace checkpoint
}  // namespace shardopt
