// kernels/muon_rules.hpp — Muon's per-element steps shared by the CPU and CUDA kernels (momentum by lerp, the Nesterov blend), so both give the same bits.
#pragma once

#include <cmath>

#include "numerics/half_float.hpp"

namespace shardopt {
namespace kernels {

// torch's lerp: start + w * (end - start) for |w| < 0.5, else end - (end - start) * (1 - w).
SHARDOPT_HOST_DEVICE float muon_lerp(float start, float end, float weight) {
  return fabsf(weight) < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.f - weight);
}

// buf.lerp_(grad, 1 - momentum), then the update: grad.lerp(buf, momentum) with Nesterov, else
// buf. Returns the update; `buf` is the momentum buffer's element, updated in place.
SHARDOPT_HOST_DEVICE float muon_momentum(float& buf, float grad, float momentum, float one_minus_momentum,
                                         bool nesterov) {
  buf = muon_lerp(buf, grad, one_minus_momentum);
  return nesterov ? muon_lerp(grad, buf, momentum) : buf;
}

}  // namespace kernels
}  // namespace shardopt
