// kernels/q8_state.hpp — 8-bit blockwise moments as bitsandbytes 0.50.1 defines them: the block, the small-tensor threshold, and the per-element decode and nearest-code search.
//
// exp_avg is held as one byte per element through the signed dynamic map, exp_avg_sq through
// the unsigned one (kernels/q8_maps.hpp), each with an fp32 absmax per block of kQ8Block
// elements of its parameter (param-relative: block b covers elements [256b, 256b + 256) of the
// parameter, the last block may be partial). Fresh state is all codes 0 and absmax 0.
// Quantising a block: absmax = max |x|; a full block scales x * (1 / max(absmax, 1e-38)) and
// stores absmax, the partial last block x / max(absmax, 1e-38) and stores the clamped absmax
// (bitsandbytes' quantize_blockwise); the scaled value, clamped to [-1, 1], takes the first
// code whose midpoint is not below it (torch.bucketize, right=False).
#pragma once

#include <cstdint>

#include "numerics/host_device.hpp"
#include "precision.hpp"
#include "q8_maps.hpp"

namespace shardopt {
namespace kernels {

constexpr int64_t kQ8Block = 256;
// bitsandbytes' min_8bit_size: parameters with fewer elements keep fp32 moments.
constexpr int64_t kQ8MinNumel = 4096;
// bitsandbytes clamps absmax below at 1e-38 (a float32 subnormal) before dividing.
constexpr uint32_t kQ8AbsmaxFloorBits = 0x006ce3eeu;

SHARDOPT_HOST_DEVICE constexpr int64_t q8_blocks(int64_t numel) { return (numel + kQ8Block - 1) / kQ8Block; }

// The quantised moments of one update call: `n` codes each from a block boundary of the
// parameter, and q8_blocks(n) absmax values each.
struct Q8Moments {
  uint8_t* exp_avg = nullptr;      // signed map
  uint8_t* exp_avg_sq = nullptr;   // unsigned map
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
};

// The first index i in [0, 255] with bounds[i] >= x (255 when none): a branch-free binary
// search over the 255 sorted midpoints, written as torch's bucketize compares (!(bound >= x)),
// so that NaN goes past every midpoint to 255 as there.
SHARDOPT_HOST_DEVICE uint32_t q8_nearest_code(const uint32_t* bounds, float x) {
  uint32_t pos = 0;
  for (uint32_t step = 128; step > 0; step >>= 1) {
    pos += !(bits_float(bounds[pos + step - 1]) >= x) ? step : 0u;
  }
  return pos;
}

// torch.clamp(x, -1, 1) and clamp(min=floor): NaN stays NaN.
SHARDOPT_HOST_DEVICE float q8_clamp_unit(float x) { return x < -1.f ? -1.f : (x > 1.f ? 1.f : x); }
SHARDOPT_HOST_DEVICE float q8_clamp_below(float x, float floor) { return x < floor ? floor : x; }

}  // namespace kernels
}  // namespace shardopt
