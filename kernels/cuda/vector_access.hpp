// kernels/cuda/vector_access.hpp — four consecutive elements in one access (16 bytes of float, 8 of bf16/f16), host and device.
//
// The item ops of mixed_items.hpp read and write a vector item through these; on the device
// each is one aligned load or store, on the host (the emulation tests) a memcpy.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/launch_plan.hpp"
#include "numerics/host_device.hpp"

namespace shardopt {
namespace kernels {

struct alignas(kVectorBytes) Float4 {
  float lane[kVectorWidth];
};

struct alignas(8) Half4 {
  uint16_t lane[kVectorWidth];
};

// Four consecutive elements of a stream in one access; `p` is aligned to 4 elements (the plan
// guarantees it for vector items).
SHARDOPT_HOST_DEVICE Float4 load4(const float* p) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  return Float4{{v.x, v.y, v.z, v.w}};
#else
  Float4 v;
  std::memcpy(v.lane, p, sizeof v.lane);
  return v;
#endif
}

SHARDOPT_HOST_DEVICE void store4(float* p, const Float4& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(p) = make_float4(v.lane[0], v.lane[1], v.lane[2], v.lane[3]);
#else
  std::memcpy(p, v.lane, sizeof v.lane);
#endif
}

SHARDOPT_HOST_DEVICE Half4 load4(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  return Half4{{static_cast<uint16_t>(w.x & 0xffffu), static_cast<uint16_t>(w.x >> 16),
                static_cast<uint16_t>(w.y & 0xffffu), static_cast<uint16_t>(w.y >> 16)}};
#else
  Half4 v;
  std::memcpy(v.lane, p, sizeof v.lane);
  return v;
#endif
}

SHARDOPT_HOST_DEVICE void store4(uint16_t* p, const Half4& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint2*>(p) = make_uint2(static_cast<uint32_t>(v.lane[0]) | (static_cast<uint32_t>(v.lane[1]) << 16),
                                            static_cast<uint32_t>(v.lane[2]) | (static_cast<uint32_t>(v.lane[3]) << 16));
#else
  std::memcpy(p, v.lane, sizeof v.lane);
#endif
}

// The vector type of a storage type.
template <typename Storage>
struct Vec4Of;
template <>
struct Vec4Of<float> {
  using type = Float4;
};
template <>
struct Vec4Of<uint16_t> {
  using type = Half4;
};

}  // namespace kernels
}  // namespace shardopt
