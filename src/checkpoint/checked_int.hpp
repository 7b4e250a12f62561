// src/checkpoint/checked_int.hpp — int64 sums and products of sizes read from files, reporting overflow instead of wrapping.
//
// Every count and offset a checkpoint file states is untrusted: signed overflow on it would be
// undefined behaviour before any range check could refuse it.
#pragma once

#include <cstdint>

#include "partition/partition.hpp"

namespace shardopt {
namespace checkpoint {

// The most elements of any tensor, parameter, shard or whole model a checkpoint may state: the
// most an optimizer lays out (2^56 floats, 256 PiB), so that whatever is saved loads. Sums and
// products of such counts with the element size and the number of tensors per file then stay
// far inside int64, so later arithmetic needs no checks.
constexpr int64_t kMaxElements = partition::kMaxElements;

// a + b into *out; false (and *out unspecified) when it overflows.
inline bool checked_add(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }
// a * b into *out; false (and *out unspecified) when it overflows.
inline bool checked_mul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }

}  // namespace checkpoint
}  // namespace shardopt
