// tests/fuzz/fuzz_manifest.cpp — libFuzzer harness: parse_manifest on any text (re-sealed, so the checks behind the checksum are reached) either returns a manifest or raises shardopt::Error.
#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/manifest.hpp"
#include "fuzz_support.hpp"
#include "shardopt/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  // Both the bytes as given (the checksum's own refusals) and re-sealed (everything after it).
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) shardopt_fuzz::reseal_manifest(text);
    try {
      // accept_version_1 reaches the unsealed (version 1) path too.
      const shardopt::checkpoint::Manifest m = shardopt::checkpoint::parse_manifest(text, "manifest.json", pass == 1);
      // A manifest that parsed is one a load trusts: its sums must be computable.
      (void)m.frozen_numel();
      (void)m.total_file_bytes();
    } catch (const shardopt::Error&) {
      // Refused with a named error: what the reader must do with bad input.
    }
  }
  return 0;
}
