// tests/fuzz/fuzz_safetensors.cpp — libFuzzer harness: read_safetensors_header on any file either returns a header whose tensors lie inside the file or raises shardopt::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/file_io.hpp"
#include "checkpoint/safetensors.hpp"
#include "fuzz_support.hpp"
#include "shardopt/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string path = shardopt_fuzz::scratch_dir() + "/input.safetensors";
  shardopt_fuzz::write_file(path, std::string(reinterpret_cast<const char*>(data), size));
  try {
    const shardopt::checkpoint::InputFile file(path);
    const int64_t file_size = file.size();
    const shardopt::checkpoint::SafetensorsHeader header = shardopt::checkpoint::read_safetensors_header(file, file_size);
    for (const shardopt::checkpoint::TensorEntry& t : header.tensors) {
      // What the reader promises a header it returns: every tensor inside the file, sized by
      // its shape. Anything else is a bug the fuzzer must report.
      if (t.begin < 0 || t.end < t.begin || header.data_start + t.end > file_size || t.end - t.begin != t.numel() * 4) {
        std::abort();
      }
    }
  } catch (const shardopt::Error&) {
  }
  return 0;
}
