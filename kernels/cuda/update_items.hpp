// kernels/cuda/update_items.hpp — the SGD/Adam work for one plan item (1 element or a float4), host and device.
//
// The CUDA kernels call these ops from their grid-stride loop; the host emulation test calls
// the very same ops, so the vector/scalar split is checked bitwise against kernels/cpu on a
// machine without a GPU. A vector item applies the shared rule to its four lanes one after
// the other, exactly as four scalar items would: with --fmad=false on the device (and
// -ffp-contract=off on the host) every element rounds the same way on either path.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda/launch_plan.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

struct alignas(kVectorBytes) Float4 {
  float lane[kVectorWidth];
};

// One 16-byte access; `p` must be 16-byte aligned (the plan guarantees it for vector items).
SHARDOPT_HOST_DEVICE Float4 load_float4(const float* p) {
#if defined(__CUDA_ARCH__)
  const float4 v = *reinterpret_cast<const float4*>(p);
  return Float4{{v.x, v.y, v.z, v.w}};
#else
  Float4 v;
  std::memcpy(v.lane, p, sizeof v.lane);
  return v;
#endif
}

SHARDOPT_HOST_DEVICE void store_float4(float* p, const Float4& v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<float4*>(p) = make_float4(v.lane[0], v.lane[1], v.lane[2], v.lane[3]);
#else
  std::memcpy(p, v.lane, sizeof v.lane);
#endif
}

struct SgdBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentum_buf = nullptr;  // only touched with momentum
};

struct AdamBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;  // only touched with amsgrad
};

// kMomentum selects whether the momentum buffer is read and written at all, so the kernel
// without momentum moves 12 bytes per element instead of 20 (as the CPU loop does).
template <bool kMomentum>
struct SgdItemOp {
  SgdBuffers buffers;
  SgdRule rule;

  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      Float4 p = load_float4(buffers.param + i);
      const Float4 g = load_float4(buffers.grad + i);
      Float4 b = kMomentum ? load_float4(buffers.momentum_buf + i) : Float4{};
      for (int l = 0; l < kVectorWidth; ++l) rule(p.lane[l], g.lane[l], b.lane[l]);
      store_float4(buffers.param + i, p);
      if (kMomentum) store_float4(buffers.momentum_buf + i, b);
    } else if (kMomentum) {
      rule(buffers.param[i], buffers.grad[i], buffers.momentum_buf[i]);
    } else {
      float unused = 0.f;
      rule(buffers.param[i], buffers.grad[i], unused);
    }
  }
};

// kAmsgrad selects whether max_exp_avg_sq is read and written at all.
template <bool kAmsgrad>
struct AdamItemOp {
  AdamBuffers buffers;
  AdamRule rule;

  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      Float4 p = load_float4(buffers.param + i);
      const Float4 g = load_float4(buffers.grad + i);
      Float4 m = load_float4(buffers.exp_avg + i);
      Float4 v = load_float4(buffers.exp_avg_sq + i);
      Float4 vmax = kAmsgrad ? load_float4(buffers.max_exp_avg_sq + i) : Float4{};
      for (int l = 0; l < kVectorWidth; ++l) {
        rule(p.lane[l], g.lane[l], m.lane[l], v.lane[l], vmax.lane[l]);
      }
      store_float4(buffers.param + i, p);
      store_float4(buffers.exp_avg + i, m);
      store_float4(buffers.exp_avg_sq + i, v);
      if (kAmsgrad) store_float4(buffers.max_exp_avg_sq + i, vmax);
    } else if (kAmsgrad) {
      rule(buffers.param[i], buffers.grad[i], buffers.exp_avg[i], buffers.exp_avg_sq[i],
           buffers.max_exp_avg_sq[i]);
    } else {
      float unused = 0.f;
      rule(buffers.param[i], buffers.grad[i], buffers.exp_avg[i], buffers.exp_avg_sq[i], unused);
    }
  }
};

// The streams a plan must keep aligned together, as byte addresses for make_vector_plan.
inline int plan_addresses(const SgdBuffers& b, bool momentum, std::uintptr_t* out) {
  int count = 0;
  out[count++] = reinterpret_cast<std::uintptr_t>(b.param);
  out[count++] = reinterpret_cast<std::uintptr_t>(b.grad);
  if (momentum) out[count++] = reinterpret_cast<std::uintptr_t>(b.momentum_buf);
  return count;
}
inline int plan_addresses(const AdamBuffers& b, bool amsgrad, std::uintptr_t* out) {
  int count = 0;
  out[count++] = reinterpret_cast<std::uintptr_t>(b.param);
  out[count++] = reinterpret_cast<std::uintptr_t>(b.grad);
  out[count++] = reinterpret_cast<std::uintptr_t>(b.exp_avg);
  out[count++] = reinterpret_cast<std::uintptr_t>(b.exp_avg_sq);
  if (amsgrad) out[count++] = reinterpret_cast<std::uintptr_t>(b.max_exp_avg_sq);
  return count;
}
constexpr int kMaxPlanStreams = 5;

}  // namespace kernels
}  // namespace shardopt
