// kernels/cpu/q8_buckets.hpp — internal to kernels/cpu: the q8 nearest-code search as two table lookups (a bucket of the float's bits, then one midpoint), built at compile time from the maps' midpoints.
//
// q8_nearest_code (q8_state.hpp) is an 8-step binary search over 255 sorted midpoints: eight
// dependent loads per element, which no vector unit does well. Here the scaled value x in
// [-1, 1] is cut into buckets by the high bits of its order-preserving integer key; each bucket
// holds at most one midpoint (checked below at compile time), so the code is the number of
// midpoints below the bucket plus one comparison with the midpoint inside it, if any (as keys:
// x > midpoint exactly when key(x) > key(midpoint)); NaN -> 255 (as the search).
// Both forms count the midpoints less than x, so they give the same code for every float.
#pragma once

#include <array>
#include <cstdint>

#include "q8_maps.hpp"

namespace shardopt {
namespace kernels {
namespace cpu_loops {

// An unsigned key in the floats' order (-0 just below +0; the midpoints are never zero).
inline constexpr uint32_t q8_order_key(uint32_t bits) { return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u); }

// Buckets of 2^shift keys from `base` (the key of the smallest value searched): the signed map
// from -1, the unsigned one from +0 (a negative value, which its moment never holds, falls in
// bucket 0 and gets code 0, as the search gives it).
struct Q8BucketShape {
  uint32_t base;
  uint32_t shift;
};
inline constexpr Q8BucketShape kQ8SignedBuckets{q8_order_key(0xbf800000u), 17};  // from -1.0
inline constexpr Q8BucketShape kQ8UnsignedBuckets{q8_order_key(0x00000000u), 16};  // from +0.0

inline constexpr uint32_t q8_bucket_count(Q8BucketShape s) {
  return ((q8_order_key(0x3f800000u) - s.base) >> s.shift) + 1;  // up to +1.0
}

// One 32-bit entry per bucket: the number of midpoints below the bucket (low 8 bits) and the
// midpoint inside it as its key's offset from the bucket's first key (high 24 bits; all ones
// when the bucket holds none, above every offset). One lookup then finds the code.
inline constexpr uint32_t kQ8NoMidpoint = 0xffffffu;
inline constexpr uint32_t kQ8BucketTableSize = 16257;
static_assert(q8_bucket_count(kQ8SignedBuckets) <= kQ8BucketTableSize, "signed bucket table too small");
static_assert(q8_bucket_count(kQ8UnsignedBuckets) <= kQ8BucketTableSize, "unsigned bucket table too small");

struct Q8BucketTable {
  std::array<uint32_t, kQ8BucketTableSize> entry{};
  bool one_midpoint_per_bucket = true;
};

inline constexpr Q8BucketTable make_q8_bucket_table(const uint32_t (&bounds)[255], Q8BucketShape s) {
  Q8BucketTable t;
  uint32_t below = 0;  // midpoints whose key is under the current bucket's first key
  const uint32_t count = q8_bucket_count(s);
  for (uint32_t b = 0; b < count; ++b) {
    const uint32_t first = s.base + (b << s.shift);
    const uint32_t last = first + ((1u << s.shift) - 1u);
    while (below < 255 && q8_order_key(bounds[below]) < first) ++below;
    uint32_t through = below;
    while (through < 255 && q8_order_key(bounds[through]) <= last) ++through;
    if (through - below > 1) t.one_midpoint_per_bucket = false;
    const uint32_t offset = through > below ? q8_order_key(bounds[below]) - first : kQ8NoMidpoint;
    t.entry[b] = below | (offset << 8);
  }
  return t;
}

inline constexpr Q8BucketTable kQ8SignedBucketTable = make_q8_bucket_table(kQ8SignedBounds, kQ8SignedBuckets);
inline constexpr Q8BucketTable kQ8UnsignedBucketTable = make_q8_bucket_table(kQ8UnsignedBounds, kQ8UnsignedBuckets);
static_assert(kQ8SignedBucketTable.one_midpoint_per_bucket, "a signed bucket holds two midpoints: lower the shift");
static_assert(kQ8UnsignedBucketTable.one_midpoint_per_bucket, "an unsigned bucket holds two midpoints: lower the shift");

// The code of a value in [-1, 1] (not NaN): the midpoints below its bucket, plus one when it is
// above the bucket's midpoint. Below the base (negative values for the unsigned map) it is bucket
// 0's first key.
inline uint32_t q8_bucket_code(uint32_t x_bits, const Q8BucketTable& table, Q8BucketShape s) {
  const uint32_t key = q8_order_key(x_bits);
  const uint32_t from_base = key < s.base ? 0u : key - s.base;
  const uint32_t entry = table.entry[from_base >> s.shift];
  return (entry & 0xffu) + ((from_base & ((1u << s.shift) - 1u)) > (entry >> 8) ? 1u : 0u);
}

}  // namespace cpu_loops
}  // namespace kernels
}  // namespace shardopt
