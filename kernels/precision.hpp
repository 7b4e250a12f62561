// kernels/precision.hpp — stochastic bf16/f16 rounding and its counter-based random bits, on top of numerics/half_float.hpp's nearest-even conversions, host and device.
//
// The nearest-even conversions and bit casts live in numerics/ (so that src/comm can use them
// without depending on kernels/); they are brought into this namespace below, so kernel code
// and tests name them as kernels:: as before. What is added here follows the same rules:
// integer arithmetic on the bit patterns, branch-free (selects only) so GCC vectorises the
// loops that call them, and variable shifts clamped below 32.
#pragma once

#include <cstdint>

#include "numerics/half_float.hpp"

namespace shardopt {
namespace kernels {

using numerics::bf16_to_float;
using numerics::bits_float;
using numerics::f16_to_float;
using numerics::float_bits;
using numerics::float_to_bf16;
using numerics::float_to_f16;
using numerics::min_u32;
using numerics::select_u32;

// Adds 16 random bits to the 16 dropped bits and truncates: the kept half goes up with
// probability (dropped bits) / 2^16, so E[result] == x for every finite x (values past the
// largest finite bf16 may carry into inf). Infinities stay, as their dropped bits are zero;
// NaN is quietened.
SHARDOPT_HOST_DEVICE uint16_t float_to_bf16_stochastic(float x, uint32_t random) {
  const uint32_t u = float_bits(x);
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (u + (random & 0xffffu)) >> 16;
  return static_cast<uint16_t>(is_nan ? ((u >> 16) | 0x0040u) : rounded);
}

namespace detail {

// For the stochastic f16 narrowing of |x| = `a` (the float's bits without sign, not NaN, at
// most 65504): the truncated f16 magnitude and the dropped fraction scaled to 32 bits
// (fraction * 2^32, rounded down where more than 32 bits are dropped).
struct F16Split {
  uint32_t truncated;
  uint32_t fraction;
};

SHARDOPT_HOST_DEVICE F16Split f16_split(uint32_t a) {
  // Normal f16 range (|x| >= 2^-14): rebias 127 -> 15 and drop 13 mantissa bits. Wraps for
  // smaller inputs; those lanes take the subnormal result below.
  const uint32_t rebiased = a - 0x38000000u;
  const uint32_t normal_truncated = rebiased >> 13;
  const uint32_t normal_fraction = rebiased << 19;
  // Subnormal f16 range: the value in units of 2^-24 is significand * 2^-shift, where the
  // significand carries the implicit bit (none for float subnormals, whose exponent counts as 1).
  const uint32_t exponent = a >> 23;
  const uint32_t significand = (a & 0x7fffffu) | (exponent != 0u ? 0x800000u : 0u);
  const uint32_t shift = 126u - (exponent != 0u ? exponent : 1u);  // >= 14 here, up to 125
  const uint32_t sub_truncated = significand >> min_u32(shift, 31u);
  // shift <= 31: the dropped bits moved to the top of a 32-bit word; shift > 31: the whole
  // significand is dropped and sits (shift - 32) places below the word.
  const uint32_t near_shift = shift < 1u ? 1u : min_u32(shift, 31u);  // in [1,31] in every lane
  const uint32_t sub_fraction_near = significand << (32u - near_shift);
  const uint32_t sub_fraction_far = significand >> min_u32(shift - 32u, 31u);
  const uint32_t sub_fraction = shift <= 31u ? sub_fraction_near : sub_fraction_far;
  const bool normal = a >= 0x38800000u;
  return F16Split{normal ? normal_truncated : sub_truncated, normal ? normal_fraction : sub_fraction};
}

}  // namespace detail

// Up with probability equal to the dropped fraction, so E[f16_to_float(result)] == x across
// the whole finite f16 range, subnormals included. The fraction is exact in 32 bits down to
// |x| = 2^-32 and rounded down to a multiple of 2^-32 below that (0 below 2^-56): the bias
// stays under 2^-56 in absolute value. |x| above the largest finite f16 (65504), inf and NaN take the
// nearest-even result.
SHARDOPT_HOST_DEVICE uint16_t float_to_f16_stochastic(float x, uint32_t random) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const detail::F16Split split = detail::f16_split(a);
  const uint32_t stochastic = split.truncated + (random < split.fraction ? 1u : 0u);
  // Past 65504 (0x477fe000), what nearest-even gives: 65504 below 65520, inf from there on.
  const uint32_t beyond = a >= 0x477ff000u ? 0x7c00u : 0x7bffu;
  const uint32_t finite = a > 0x477fe000u ? beyond : stochastic;
  const uint32_t quiet_nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  return static_cast<uint16_t>(sign | (a > 0x7f800000u ? quiet_nan : finite));
}

// ---- counter-based random bits for stochastic rounding --------------------------------------------

// A 32-bit integer mixer with low bias (the "lowbias32" constants): a bijection in which every
// input bit affects every output bit.
SHARDOPT_HOST_DEVICE uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The per-call part of rounding_random: (seed, step) absorbed word by word. The constant
// added after each round keeps an all-zero input away from the mixer's fixed point at zero.
SHARDOPT_HOST_DEVICE uint32_t rounding_step_key(uint64_t seed, uint64_t step) {
  uint32_t k = 0x6a09e667u;
  k = mix32(k ^ static_cast<uint32_t>(seed)) + 0x9e3779b9u;
  k = mix32(k ^ static_cast<uint32_t>(seed >> 32)) + 0x9e3779b9u;
  k = mix32(k ^ static_cast<uint32_t>(step)) + 0x9e3779b9u;
  k = mix32(k ^ static_cast<uint32_t>(step >> 32)) + 0x9e3779b9u;
  return k;
}

// The keys of one block of 2^32 indices (those sharing the index's high word): loops hoist
// them, so that the per-element work is 32-bit only.
struct RoundingBlockKey {
  uint32_t inner;
  uint32_t outer;
};

SHARDOPT_HOST_DEVICE RoundingBlockKey rounding_block_key(uint32_t step_key, uint32_t index_high) {
  const uint32_t inner = mix32(step_key ^ index_high) + 0x9e3779b9u;
  return RoundingBlockKey{inner, mix32(inner ^ 0xbb67ae85u)};
}

// One keyed mixer round over the index's low word (the keys carry seed, step and the high
// word): two 32-bit multiplies per element.
SHARDOPT_HOST_DEVICE uint32_t rounding_random_in_block(const RoundingBlockKey& key, uint32_t index_low) {
  return mix32(index_low ^ key.inner) ^ key.outer;
}

SHARDOPT_HOST_DEVICE uint32_t rounding_random_keyed(uint32_t step_key, uint64_t index) {
  return rounding_random_in_block(rounding_block_key(step_key, static_cast<uint32_t>(index >> 32)),
                                  static_cast<uint32_t>(index));
}

// 32 random bits for element `index` of the flat parameter space at optimizer step `step`:
// a pure function of (seed, step, index), so results never depend on shard boundaries,
// thread counts or the device.
SHARDOPT_HOST_DEVICE uint32_t rounding_random(uint64_t seed, uint64_t step, uint64_t index) {
  return rounding_random_keyed(rounding_step_key(seed, step), index);
}

}  // namespace kernels
}  // namespace shardopt
