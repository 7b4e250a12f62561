// tests/fuzz/fuzz_support.hpp — what the checkpoint fuzz harnesses share: a scratch directory per process, files written into it, and manifests re-sealed so the fuzzer gets past their checksum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardopt_fuzz {

// A directory of this process's own, created once (removed by the harness between inputs).
const std::string& scratch_dir();
// Writes `bytes` to `path`, replacing it; aborts when the scratch directory cannot be written
// (a harness that cannot write its input tests nothing).
void write_file(const std::string& path, const std::string& bytes);
// Removes every file in `dir` (not recursively: the harnesses write flat directories).
void clear_dir(const std::string& dir);
// When `text` ends with a manifest seal, rewrites its digits to the checksum its contents have:
// a mutated manifest then reaches the parser behind the checksum instead of stopping there.
void reseal_manifest(std::string& text);

}  // namespace shardopt_fuzz
