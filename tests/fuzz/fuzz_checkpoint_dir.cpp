// tests/fuzz/fuzz_checkpoint_dir.cpp — libFuzzer harness: the offline verification of a whole checkpoint directory (what `shardopt-ckpt verify` runs) either passes or raises shardopt::Error.
//
// The input is a packed directory (tests/fuzz/pack_dir.py writes seeds in this form): records
// of [u32 name length][name][u32 data length][data], little-endian; names are plain file names.
// manifest.json is re-sealed so that mutations reach the checks behind its checksum.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <string>

#include "checkpoint/validate.hpp"
#include "fuzz_support.hpp"
#include "shardopt/error.hpp"

namespace {

bool read_u32(const uint8_t*& p, const uint8_t* end, uint32_t* out) {
  if (end - p < 4) return false;
  std::memcpy(out, p, 4);
  p += 4;
  return true;
}

// A file name the harness may create: no path separators, not "." or "..", not empty.
bool plain_name(const std::string& name) {
  return !name.empty() && name.size() < 200 && name != "." && name != ".." &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string dir = shardopt_fuzz::scratch_dir();
  shardopt_fuzz::clear_dir(dir);
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  for (int files = 0; files < 8; ++files) {
    uint32_t name_size = 0, data_size = 0;
    if (!read_u32(p, end, &name_size) || static_cast<std::size_t>(end - p) < name_size) break;
    std::string name(reinterpret_cast<const char*>(p), name_size);
    p += name_size;
    if (!read_u32(p, end, &data_size)) break;
    data_size = static_cast<uint32_t>(std::min<std::size_t>(data_size, static_cast<std::size_t>(end - p)));
    std::string bytes(reinterpret_cast<const char*>(p), data_size);
    p += data_size;
    if (!plain_name(name)) continue;
    if (name == "manifest.json") shardopt_fuzz::reseal_manifest(bytes);
    shardopt_fuzz::write_file(dir + "/" + name, bytes);
  }
  try {
    shardopt::checkpoint::open_checked_checkpoint(dir, shardopt::checkpoint::FileShare{}, {});
  } catch (const shardopt::Error&) {
  }
  return 0;
}
