// kernels/cuda/mixed_items.hpp — the SGD/Adam work and the dtype conversions for one plan item (1 element or 4), for f32 and bf16/f16 parameters, host and device.
//
// The CUDA kernels call these ops from their grid-stride loop; the host emulation tests call
// the very same ops, so the CUDA indexing and vector/scalar split are checked bitwise against
// kernels/cpu on a machine without a GPU. Each lane goes through the same per-element steps as
// kernels/cpu (mixed_update.hpp, precision.hpp): a vector item applies the shared rule to its
// four lanes one after the other, exactly as four scalar items would, and with --fmad=false on
// the device (-ffp-contract=off on the host) every element rounds the same way on either path.
// f32 parameters take the same ops (F32Format, no master; with an identity transform the
// gradient is used as is). Vector items use the plan of launch_plan.hpp with per-stream
// element sizes: 16-byte accesses to float streams, 8-byte accesses to 16-bit streams.
#pragma once

#include <cstdint>

#include "cuda/launch_plan.hpp"
#include "cuda/vector_access.hpp"
#include "mixed_update.hpp"
#include "precision.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// What every mixed update item needs besides its state streams.
struct MixedCommon {
  void* param = nullptr;
  const void* grad = nullptr;
  float* master = nullptr;  // null for f32
  GradTransform gt;
  bool transform = false;   // false: gt is the identity and no multiply happens
  uint32_t step_key = 0;    // rounding_step_key(seed, step), for stochastic rounding
  uint64_t first_index = 0; // rounding index of element 0
};

// The lane-level steps of a mixed update: read the gradient and master, and write the master
// and parameter back. Format decides the storage; kStochastic the narrowing.
template <typename Format, bool kStochastic>
struct MixedLanes {
  using Storage = typename Format::Storage;
  using Vec = typename Vec4Of<Storage>::type;
  MixedCommon c;

  SHARDOPT_HOST_DEVICE Storage* param() const { return static_cast<Storage*>(c.param); }
  SHARDOPT_HOST_DEVICE const Storage* grad() const { return static_cast<const Storage*>(c.grad); }
  // The fp32 value the rule updates: the master, or the f32 parameter itself.
  SHARDOPT_HOST_DEVICE float* value() const {
    return Format::kHasMaster ? c.master : reinterpret_cast<float*>(c.param);
  }

  SHARDOPT_HOST_DEVICE float gradient(Storage raw) const {
    const float g = Format::widen(raw);
    return c.transform ? transform_grad(g, c.gt) : g;
  }
  SHARDOPT_HOST_DEVICE Storage narrowed(float p, int64_t i) const {
    const uint32_t random =
        kStochastic ? rounding_random_keyed(c.step_key, c.first_index + static_cast<uint64_t>(i)) : 0u;
    return narrow_param<Format, kStochastic>(p, random);
  }
  // Writes element i's updated value: the master and the narrowed parameter, or the f32 parameter.
  SHARDOPT_HOST_DEVICE void store(int64_t i, float p) const {
    value()[i] = p;
    if (Format::kHasMaster) param()[i] = narrowed(p, i);
  }
  SHARDOPT_HOST_DEVICE void store4(int64_t i, const Float4& p) const {
    kernels::store4(value() + i, p);
    if (Format::kHasMaster) {
      Vec out;
      for (int l = 0; l < kVectorWidth; ++l) out.lane[l] = narrowed(p.lane[l], i + l);
      kernels::store4(param() + i, out);
    }
  }
};

// kMomentum selects whether the momentum buffer is read and written at all.
template <typename Format, bool kStochastic, bool kMomentum>
struct MixedSgdItemOp {
  MixedLanes<Format, kStochastic> lanes;
  float* momentum_buf = nullptr;
  SgdRule rule;

  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      Float4 p = load4(lanes.value() + i);
      const auto g = load4(lanes.grad() + i);
      Float4 b = kMomentum ? load4(momentum_buf + i) : Float4{};
      for (int l = 0; l < kVectorWidth; ++l) rule(p.lane[l], lanes.gradient(g.lane[l]), b.lane[l]);
      lanes.store4(i, p);
      if (kMomentum) store4(momentum_buf + i, b);
    } else {
      float p = lanes.value()[i];
      const float g = lanes.gradient(lanes.grad()[i]);
      if (kMomentum) {
        rule(p, g, momentum_buf[i]);
      } else {
        float unused = 0.f;
        rule(p, g, unused);
      }
      lanes.store(i, p);
    }
  }
};

// kAmsgrad selects whether max_exp_avg_sq is read and written at all.
template <typename Format, bool kStochastic, bool kAmsgrad>
struct MixedAdamItemOp {
  MixedLanes<Format, kStochastic> lanes;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  AdamRule rule;

  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      Float4 p = load4(lanes.value() + i);
      const auto g = load4(lanes.grad() + i);
      Float4 m = load4(exp_avg + i);
      Float4 v = load4(exp_avg_sq + i);
      Float4 vmax = kAmsgrad ? load4(max_exp_avg_sq + i) : Float4{};
      for (int l = 0; l < kVectorWidth; ++l) {
        rule(p.lane[l], lanes.gradient(g.lane[l]), m.lane[l], v.lane[l], vmax.lane[l]);
      }
      lanes.store4(i, p);
      store4(exp_avg + i, m);
      store4(exp_avg_sq + i, v);
      if (kAmsgrad) store4(max_exp_avg_sq + i, vmax);
    } else {
      float p = lanes.value()[i];
      const float g = lanes.gradient(lanes.grad()[i]);
      if (kAmsgrad) {
        rule(p, g, exp_avg[i], exp_avg_sq[i], max_exp_avg_sq[i]);
      } else {
        float unused = 0.f;
        rule(p, g, exp_avg[i], exp_avg_sq[i], unused);
      }
      lanes.store(i, p);
    }
  }
};

// ---- conversions: dst = widen(src), dst = narrow(src), x = narrow(widen(x) / divisor) ------------

template <typename Format>
struct WidenItemOp {
  const typename Format::Storage* src = nullptr;
  float* dst = nullptr;
  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      const auto v = load4(src + i);
      Float4 out;
      for (int l = 0; l < kVectorWidth; ++l) out.lane[l] = Format::widen(v.lane[l]);
      store4(dst + i, out);
    } else {
      dst[i] = Format::widen(src[i]);
    }
  }
};

template <typename Format>
struct NarrowItemOp {
  const float* src = nullptr;
  typename Format::Storage* dst = nullptr;
  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      const Float4 v = load4(src + i);
      typename Vec4Of<typename Format::Storage>::type out;
      for (int l = 0; l < kVectorWidth; ++l) out.lane[l] = Format::narrow(v.lane[l]);
      store4(dst + i, out);
    } else {
      dst[i] = Format::narrow(src[i]);
    }
  }
};

template <typename Format>
struct DivideItemOp {
  typename Format::Storage* x = nullptr;
  float divisor = 1.f;
  SHARDOPT_HOST_DEVICE void operator()(const PlanItem& item) const {
    const int64_t i = item.first;
    if (item.width == kVectorWidth) {
      auto v = load4(x + i);
      for (int l = 0; l < kVectorWidth; ++l) v.lane[l] = Format::narrow(Format::widen(v.lane[l]) / divisor);
      store4(x + i, v);
    } else {
      x[i] = Format::narrow(Format::widen(x[i]) / divisor);
    }
  }
};

// ---- plans ---------------------------------------------------------------------------------------

constexpr int kMaxMixedStreams = 6;

// The streams of one mixed update as (address, element size) pairs for make_vector_plan:
// parameter and gradient of the dtype, the master where there is one, then the float state
// streams given (null ones are left out: they are not touched).
inline int mixed_plan_streams(const MixedCommon& c, DType dtype, const float* const* states,
                              int state_count, std::uintptr_t* addresses, int* sizes) {
  const int element = static_cast<int>(dtype_size(dtype));
  int count = 0;
  addresses[count] = reinterpret_cast<std::uintptr_t>(c.param);
  sizes[count++] = element;
  addresses[count] = reinterpret_cast<std::uintptr_t>(c.grad);
  sizes[count++] = element;
  if (c.master) {
    addresses[count] = reinterpret_cast<std::uintptr_t>(c.master);
    sizes[count++] = static_cast<int>(sizeof(float));
  }
  for (int k = 0; k < state_count && count < kMaxMixedStreams; ++k) {
    if (!states[k]) continue;
    addresses[count] = reinterpret_cast<std::uintptr_t>(states[k]);
    sizes[count++] = static_cast<int>(sizeof(float));
  }
  return count;
}

}  // namespace kernels
}  // namespace shardopt
