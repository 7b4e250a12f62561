// numerics/half_float.hpp — bf16/f16 <-> float with round-to-nearest-even, and float bit casts, host and device.
//
// Integer arithmetic on the bit patterns, plus two float operations whose results IEEE fixes
// exactly (an exact scaling in f16_to_float, one nearest-even addition in float_to_f16); no
// float16 hardware instructions. So the host loops, their vectorised forms, the CUDA kernels
// and the MPI reductions produce the same bits. The functions are branch-free (selects only),
// which lets GCC vectorise the loops that call them; variable shifts are clamped below 32 so
// no lane ever shifts by an undefined amount. A leaf: kernels/ (which adds stochastic
// rounding in kernels/precision.hpp) and src/comm both use it without depending on each other.
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"

namespace shardopt {
namespace numerics {

// ---- bit casts (no memcpy: they must also compile in device code) ------------------------------

SHARDOPT_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  // GCC and Clang define reading the other member of a union (type punning).
  union {
    float f;
    uint32_t u;
  } pun{x};
  return pun.u;
#endif
}

SHARDOPT_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  union {
    uint32_t u;
    float f;
  } pun{u};
  return pun.f;
#endif
}

SHARDOPT_HOST_DEVICE uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// `condition ? a : b` as a bit blend. Where one operand comes from float arithmetic, GCC
// would otherwise sink that arithmetic into a branch (it may trap) and then refuse to
// vectorise the loop ("control flow in loop").
SHARDOPT_HOST_DEVICE uint32_t select_u32(bool condition, uint32_t a, uint32_t b) {
  return b ^ ((a ^ b) & (0u - static_cast<uint32_t>(condition)));
}

// ---- bf16: the top half of a float --------------------------------------------------------------

SHARDOPT_HOST_DEVICE float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest, ties to even: adding 0x7fff plus the kept LSB carries into the kept half
// exactly when the dropped half is above one half, or equal to it with an odd kept half. A carry
// out of the largest finite value yields the infinity pattern, as IEEE RNE overflow does.
SHARDOPT_HOST_DEVICE uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;  // keeps sign and top payload bits
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

// ---- f16 (IEEE binary16) -------------------------------------------------------------------------

// Exact: normal values rebias the exponent; subnormals (m * 2^-24) are converted through an
// exact int->float conversion and a power-of-two scale.
SHARDOPT_HOST_DEVICE float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  const uint32_t special = 0x7f800000u | (mantissa << 13);  // inf, NaN with its payload
  const uint32_t subnormal = float_bits(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
  const uint32_t magnitude = select_u32(exponent == 0u, subnormal, select_u32(exponent == 31u, special, normal));
  return bits_float(sign | magnitude);
}

// Round to nearest, ties to even, subnormals included; overflow gives inf; NaN becomes a quiet
// NaN with its sign and top payload bits (what x86's vcvtps2ph produces).
SHARDOPT_HOST_DEVICE uint16_t float_to_f16(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal f16 range: rebias the exponent (127 -> 15) and round the 13 dropped bits with the
  // add-and-carry of float_to_bf16. A carry out of the mantissa bumps the exponent, as it
  // should; the clamp covers inf and everything that rounds past 65504. (Wraps for small
  // inputs, which take the subnormal result.)
  const uint32_t normal = min_u32((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13, 0x7c00u);
  // Subnormal f16 range (|x| < 2^-14): in |x| + 0.5f the float's last mantissa bit is worth
  // 2^-24, the f16 subnormal step, so the IEEE adder itself rounds to nearest even, and the
  // sum's bits minus those of 0.5f count the steps (up to 0x400, the smallest normal). Exact
  // on any IEEE adder in the default rounding mode; a flush-to-zero adder would only change
  // inputs below 2^-126, which round to 0 anyway.
  const uint32_t subnormal = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  const uint32_t finite = select_u32(a < 0x38800000u, subnormal, normal);
  const uint32_t quiet_nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  return static_cast<uint16_t>(sign | select_u32(a > 0x7f800000u, quiet_nan, finite));
}

}  // namespace numerics
}  // namespace shardopt
