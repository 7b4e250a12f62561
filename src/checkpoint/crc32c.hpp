// src/checkpoint/crc32c.hpp — CRC32C (Castagnoli) of byte streams, the checksum of every checkpoint file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardopt {
namespace checkpoint {

// Continues a CRC32C over `bytes` more bytes: crc32c_update(0, ...) starts one, and feeding a
// stream in pieces gives the same value as feeding it at once. Uses the SSE4.2 instruction
// where the CPU has it (tens of GB/s, so checksumming never dominates I/O), a table otherwise.
uint32_t crc32c_update(uint32_t crc, const void* data, std::size_t bytes);

}  // namespace checkpoint
}  // namespace shardopt
