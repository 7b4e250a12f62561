// src/checkpoint/safetensors.hpp — the safetensors container: 8-byte LE header length, JSON header, raw data.
//
// Only what checkpoints need: F32 tensors. Headers are padded with spaces so that the data
// starts on an 8-byte boundary (as the reference writer does), and tensors are laid out in
// the order given, back to back, so that Python's safetensors reads the files as they are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"

namespace shardopt {
namespace checkpoint {

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;  // empty shape = scalar
  int64_t begin = 0;           // byte offsets within the data section
  int64_t end = 0;
  int64_t numel() const;
};

// Assigns consecutive data offsets to `tensors` (in order) and returns the bytes that precede
// the data: the length word and the padded JSON header.
std::string encode_safetensors_header(std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

struct SafetensorsHeader {
  int64_t data_start = 0;  // file offset of the data section
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  const TensorEntry* find(const std::string& name) const;  // null when absent
};

// Parses and checks the header of `file` (of `file_size` bytes): F32 only, offsets inside the
// data section, sizes matching shapes, the data section ending exactly at the end of the file.
// Error(corrupt) naming the file otherwise.
SafetensorsHeader read_safetensors_header(const InputFile& file, int64_t file_size);

}  // namespace checkpoint
}  // namespace shardopt
