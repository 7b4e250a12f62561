// src/checkpoint/safetensors.hpp — the safetensors container: 8-byte LE header length, JSON header, raw data.
//
// Only what checkpoints need: F32 tensors, and U8 for 8-bit optimizer state (shard format 2). Headers are padded with spaces so that the data
// starts on an 8-byte boundary (as the reference writer does), and tensors are laid out in
// the order given, back to back, so that Python's safetensors reads the files as they are.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_io.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace checkpoint {

struct TensorEntry {
  std::string name;
  std::vector<int64_t> shape;  // empty shape = scalar
  int64_t begin = 0;           // byte offsets within the data section
  int64_t end = 0;
  DType dtype = DType::f32;  // f32 ("F32") or byte ("U8")
  // The product of the shape; Error(corrupt) naming the tensor when it overflows (a header
  // read from a file has been checked already, so this never throws for one).
  int64_t numel() const;
};

// Assigns consecutive data offsets to `tensors` (in order) and returns the bytes that precede
// the data: the length word and the padded JSON header.
std::string encode_safetensors_header(std::vector<TensorEntry>& tensors,
                                      const std::map<std::string, std::string>& metadata);

struct SafetensorsHeader {
  int64_t data_start = 0;  // file offset of the data section
  std::vector<TensorEntry> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;
  const TensorEntry* find(const std::string& name) const;  // null when absent
};

// Parses and checks the header of `file` (of `file_size` bytes) as the reference reader does:
// a header length within the file and at most 100 MiB, JSON without duplicate keys, string
// metadata, F32 only (Error(unsupported) otherwise), integer shapes and offsets, and tensors
// that, sorted by offset, are contiguous, do not overlap, match their shapes' sizes and cover
// the data section exactly; every product and sum checked for overflow. Error(corrupt) naming
// the file and the tensor otherwise.
SafetensorsHeader read_safetensors_header(const InputFile& file, int64_t file_size);

}  // namespace checkpoint
}  // namespace shardopt
