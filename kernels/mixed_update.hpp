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
};

// ---- element formats: storage, exact widening, nearest-even and stochastic narrowing -------------

struct F32Format {
  using Storage = float;
  static constexpr DType kDType = DType::f32;
  static constexpr bool kHasMaster = false;
  SHARDOPT_HOST_DEVICE static float widen(float x) { return x; }
  SHARDOPT_HOST_DEVICE static float narrow(float x) { return x; }
  SHARDOPT_HOST_DEVICE static float narrow_stochastic(float x, uint32_t) { return x; }
};

struct Bf16Format {
  using Storage = uint16_t;
  static constexpr DType kDType = DType::bf16;
  static constexpr bool kHasMaster = true;
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
  SHARDOPT_HOST_DEVICE static float widen(uint16_t h) { return f16_to_float(h); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow(float x) { return float_to_f16(x); }
  SHARDOPT_HOST_DEVICE static uint16_t narrow_stochastic(float x, uint32_t random) {
    return float_to_f16_stochastic(x, random);
  }
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
