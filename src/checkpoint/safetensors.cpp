// src/checkpoint/safetensors.cpp — encoding safetensors headers, and validating them as the reference reader does.
#include "checkpoint/safetensors.hpp"

#include <algorithm>
#include <cstring>

#include <fmt/ranges.h>

#include "checkpoint/checked_int.hpp"
#include "checkpoint/json_reader.hpp"
#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

// The reference implementation refuses larger headers; so do we, before allocating one.
constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;

// The dtypes a checkpoint holds, by their safetensors names.
const char* safetensors_dtype(DType dtype) { return dtype == DType::byte ? "U8" : "F32"; }

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Elements of `shape` and bytes of a tensor of it; false when either overflows.
bool shape_bytes(const std::vector<int64_t>& shape, DType dtype, int64_t* numel, int64_t* bytes) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (!checked_mul(n, d, &n)) return false;
  }
  *numel = n;
  return checked_mul(n, static_cast<int64_t>(dtype_size(dtype)), bytes);
}

// One tensor entry of the header: {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}.
TensorEntry parse_tensor(const std::string& name, const nlohmann::json& value, const std::string& path) {
  // Fields are named "params.dtype" in messages (an empty tensor name as "''").
  const JsonObject entry(value, path, name.empty() ? std::string("''") : name);
  entry.only({"dtype", "shape", "data_offsets"});
  const std::string dtype = entry.string("dtype");
  SHARDOPT_CHECK(dtype == "F32" || dtype == "U8", unsupported,
                 "'{}': tensor '{}' has dtype {}; shardopt checkpoints hold F32 only (and U8 for 8-bit moments)", path,
                 name, dtype);
  TensorEntry t;
  t.name = name;
  t.dtype = dtype == "U8" ? DType::byte : DType::f32;
  const nlohmann::json& shape = entry.at("shape");
  SHARDOPT_CHECK(shape.is_array(), corrupt, "'{}': tensor '{}' has shape {}, not a list", path, name, json_excerpt(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    t.shape.push_back(json_integer(shape[i], 0, INT64_MAX, path, fmt::format("tensor '{}' shape[{}]", name, i)));
  }
  const nlohmann::json& offsets = entry.at("data_offsets");
  SHARDOPT_CHECK(offsets.is_array() && offsets.size() == 2, corrupt,
                 "'{}': tensor '{}' has data_offsets {}, not two offsets", path, name, json_excerpt(offsets));
  t.begin = json_integer(offsets[0], 0, INT64_MAX, path, fmt::format("tensor '{}' data_offsets[0]", name));
  t.end = json_integer(offsets[1], 0, INT64_MAX, path, fmt::format("tensor '{}' data_offsets[1]", name));
  return t;
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) {
    SHARDOPT_CHECK(checked_mul(n, d, &n), corrupt, "tensor '{}': shape {} overflows a 64-bit size", name, shape_text(shape));
  }
  return n;
}

std::string encode_safetensors_header(std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (TensorEntry& t : tensors) {
    t.begin = offset;
    t.end = offset + t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
    offset = t.end;
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
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
  SHARDOPT_CHECK(file_size >= 8, corrupt, "'{}' is {} bytes, too short for a safetensors header (truncated?)", path,
                 file_size);
  uint64_t length = 0;
  file.read_at(0, &length, 8);
  // Compared as unsigned: a length word of 2^64-1 must not become negative.
  SHARDOPT_CHECK(length <= static_cast<uint64_t>(kMaxHeaderBytes), corrupt,
                 "'{}': the header length word says {} bytes, more than the 100 MiB safetensors allows", path, length);
  SHARDOPT_CHECK(length <= static_cast<uint64_t>(file_size - 8), corrupt,
                 "'{}': the header length word says {} bytes but the file has {} bytes after it (truncated?)", path,
                 length, file_size - 8);
  std::string text(static_cast<std::size_t>(length), '\0');
  file.read_at(8, text.data(), text.size());

  SafetensorsHeader header;
  header.data_start = 8 + static_cast<int64_t>(length);
  const int64_t data_bytes = file_size - header.data_start;
  const nlohmann::json json = parse_json_strict(text, path, "the safetensors header");
  SHARDOPT_CHECK(json.is_object(), corrupt, "'{}': the safetensors header is not a JSON object", path);
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") {
      SHARDOPT_CHECK(value.is_object(), corrupt, "'{}': __metadata__ is not a JSON object", path);
      for (const auto& [key, v] : value.items()) {
        SHARDOPT_CHECK(v.is_string(), corrupt, "'{}': __metadata__ '{}' is {}, not a string", path, key, json_excerpt(v));
        header.metadata[key] = v.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_tensor(name, value, path));
  }
  // The reference reader's order and checks: sorted by (begin, end), each tensor must start
  // where the previous one ended and span exactly its shape's bytes, and the last must end
  // where the file does. That refuses overlaps, gaps and data the header does not account for.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t next = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : header.tensors) {
    if (t.begin != next) {
      SHARDOPT_CHECK(previous != nullptr, corrupt,
                     "'{}': invalid offset: the first tensor '{}' starts at data byte {}, not 0", path, t.name, t.begin);
      raise(ErrorCode::corrupt, "'{}': invalid offset: tensor '{}' starts at data byte {} but '{}' ends at {} ({})", path,
            t.name, t.begin, previous->name, next, t.begin < next ? "overlapping tensors" : "a gap between tensors");
    }
    SHARDOPT_CHECK(t.end >= t.begin, corrupt,
                   "'{}': invalid offset: tensor '{}' ends at data byte {}, before it starts at {}", path, t.name, t.end,
                   t.begin);
    int64_t numel = 0, bytes = 0;
    SHARDOPT_CHECK(shape_bytes(t.shape, t.dtype, &numel, &bytes), corrupt,
                   "'{}': tensor '{}' has shape {}, which overflows a 64-bit size", path, t.name, shape_text(t.shape));
    SHARDOPT_CHECK(t.end - t.begin == bytes, corrupt, "'{}': tensor '{}' spans {} bytes but its shape {} needs {}", path,
                   t.name, t.end - t.begin, shape_text(t.shape), bytes);
    SHARDOPT_CHECK(t.end <= data_bytes, corrupt,
                   "'{}': tensor '{}' claims data bytes [{}, {}) but the file holds {} data bytes (truncated?)", path,
                   t.name, t.begin, t.end, data_bytes);
    next = t.end;
    previous = &t;
  }
  SHARDOPT_CHECK(next == data_bytes, corrupt, "'{}': its tensors end at data byte {} but the file holds {} data bytes",
                 path, next, data_bytes);
  return header;
}

}  // namespace checkpoint
}  // namespace shardopt
