// kernels/mixed_update.hpp — what one update call takes besides the rule (dtype, fp32 master, gradient transform, rounding) and the per-element steps shared by CPU and CUDA.
//
// Per element for a bf16/f16 parameter: p = master[i]; g = (widen(grad[i]) * unscale) * clip;
// rule(p, g, state...); master[i] = p; param[i] = narrow(p). For f32 the parameter is its own
// master. Both backends compose exactly these helpers, so their results agree bit for bit.
#pragma once

#include <cstdint>

#include "precision.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// How each gradient element is transformed before the rule: g = (g * unscale) * clip, in
// float, in that order (torch's GradScaler.unscale_ then clip_grad_norm_'s mul_). With both 1
// the multiplies are skipped, so the result is bitwise the plain f32 rule.
struct GradTransform {
  float unscale = 1.f;
  float clip = 1.f;
};

SHARDOPT_HOST_DEVICE bool is_identity(const GradTransform& gt) {
  return gt.unscale == 1.f && gt.clip == 1.f;
}

SHARDOPT_HOST_DEVICE float transform_grad(float g, const GradTransform& gt) {
  return (g * gt.unscale) * gt.clip;
}

// How the updated fp32 master is written into a bf16/f16 parameter.
struct Rounding {
  bool stochastic = false;
  uint64_t seed = 0;
  uint64_t step = 0;
  // rounding_random index of element 0 of this call; element i uses first_index + i.
  uint64_t first_index = 0;
};

// The tensors of one update call.
struct UpdateTensors {
  void* param = nullptr;        // n elements of dtype: f32 -> updated in place (it is the master); bf16/f16 -> written from the master
  const void* grad = nullptr;   // n elements of dtype
  float* master = nullptr;      // n fp32 master values, required for bf16/f16 (read, updated, written back); must be null for f32
  DType dtype = DType::f32;
  // bf16 only, instead of `master` (which must then be null): n 16-bit remainders that, with the
  // parameter, hold the fp32 master exactly (master_from_remainder). Nearest rounding only.
  int16_t* master_remainder = nullptr;
};

// ---- 16-bit master remainders (TransformerEngine's and apex's store_param_remainders) -------------
//
// The fp32 master m is kept as the bf16 parameter p and the low half r of m's bits: the high
// half is m >> 16, rounded up (one unit of its bit pattern: away from zero) when r as a signed
// 16-bit value is negative, i.e. when the dropped half is at least 0x8000. So p is m rounded to
// nearest with ties away from zero (nearest-even only differs at exact ties: dropped half 0x8000
// under an even high half), and m is rebuilt exactly from (p, r) by undoing that carry. Both
// directions are bit operations modulo 2^16, so every fp32 pattern (inf and NaN included)
// survives the round trip.
SHARDOPT_HOST_DEVICE float master_from_remainder(uint16_t param, int16_t remainder) {
  const uint32_t high = static_cast<uint16_t>(param - (remainder < 0 ? 1u : 0u));
  return bits_float((high << 16) | static_cast<uint16_t>(remainder));
}

SHARDOPT_HOST_DEVICE uint16_t param_of_master(float master) {
  const uint32_t u = float_bits(master);
  return static_cast<uint16_t>((u >> 16) + ((u & 0x8000u) != 0u ? 1u : 0u));
}

SHARDOPT_HOST_DEVICE int16_t remainder_of_master(float master) {
  return static_cast<int16_t>(static_cast<uint16_t>(float_bits(master) & 0xffffu));
}

// ---- element formats: storage, exact widening, nearest-even and stochastic narrowing -------------

struct F32Format {
  using Storage = float;
  static constexpr DType kDType = DType::f32;
  static constexpr bool kHasMaster = false;
  static constexpr bool kRemainder = false;
  SHARDOPT_HOST_DEVICE static float widen(float x) { return x; }
  SHARDOPT_HOST_DEVICE static float narrow(float x) { return x; }
  SHARDOPT_HOST_DEVICE static float narrow_stochastic(float x, uint32_t) { return x; }
};

struct Bf16Format {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::bf16;
  static constexpr bool kHasMaster = true;
  static constexpr bool kRemainder = false;
  SHARDOPT_HOST_DEVICE static float widen(uint16_t h) { return bf16_to_float(h); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow(float x) { return float_to_bf16(x); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow_stochastic(float x, uint32_t random) {
    return float_to_bf16_stochastic(x, random);
  }
};

struct F16Format {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::f16;
  static constexpr bool kHasMaster = true;
  static constexpr bool kRemainder = false;
  SHARDOPT_HOST_DEVICE static float widen(uint16_t h) { return f16_to_float(h); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow(float x) { return float_to_f16(x); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow_stochastic(float x, uint32_t random) {
    return float_to_f16_stochastic(x, random);
  }
};

// bf16 parameters whose master is the parameter and a 16-bit remainder (no fp32 master array).
struct Bf16RemainderFormat : Bf16Format {
  static constexpr bool kHasMaster = false;
  static constexpr bool kRemainder = true;
};

// The parameter written from an updated master value: nearest-even, or stochastic with the
// random bits of its element.
template <typename Format, bool kStochastic>
SHARDOPT_HOST_DEVICE typename Format::Storage narrow_param(float p, uint32_t random) {
  if (kStochastic) return Format::narrow_stochastic(p, random);
  return Format::narrow(p);
}

}  // namespace kernels
}  // namespace shardopt
