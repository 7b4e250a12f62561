// kernels/cpu/update_q8_cpu.cpp — Adam/AdamW with 8-bit blockwise moments, fused per block (dequantise, update, new absmax, quantise); compiled once per ISA variant.
//
// Blocks are independent, so threads take whole blocks and results never depend on the thread
// count. Every operation is an IEEE float operation without contraction (-ffp-contract=off),
// a table lookup, or a comparison: every variant gives the same bits. The absmax is an exact
// maximum (order-free), with NaN tracked apart so that it propagates as torch's max does.
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu/loop_support.hpp"
#include "precision.hpp"
#include "q8_state.hpp"

SHARDOPT_CPU_VARIANT_BEGIN
namespace {

using namespace cpu_loops;

template <typename Format>
inline float load_param(const typename Format::Storage* param, const float* master, const int16_t* remainder,
                        int64_t i) {
  if constexpr (Format::kRemainder) return master_from_remainder(param[i], remainder[i]);
  else if constexpr (Format::kHasMaster) return master[i];
  else return param[i];
}

template <typename Format, bool kStochastic>
inline void store_param(typename Format::Storage* param, float* master, int16_t* remainder, int64_t i, float p,
                        uint32_t random) {
  if constexpr (Format::kRemainder) {
    param[i] = param_of_master(p);
    remainder[i] = remainder_of_master(p);
  } else if constexpr (Format::kHasMaster) {
    master[i] = p;
    param[i] = narrow_param<Format, kStochastic>(p, random);
  } else {
    param[i] = p;
  }
}

// One moment's block: the new absmax (NaN when any value is NaN) and the codes.
inline void quantise_block(const float* x, int64_t len, const uint32_t* bounds, uint8_t* codes, float* absmax) {
  float largest = 0.f;
  bool nan = false;
  for (int64_t i = 0; i < len; ++i) {
    const float a = std::fabs(x[i]);
    largest = a > largest ? a : largest;
    nan = nan || a != a;
  }
  const float raw = nan ? std::numeric_limits<float>::quiet_NaN() : largest;
  const float clamped = q8_clamp_below(raw, bits_float(kQ8AbsmaxFloorBits));
  if (len == kQ8Block) {
    const float inverse = 1.f / clamped;
    for (int64_t i = 0; i < len; ++i) codes[i] = static_cast<uint8_t>(q8_nearest_code(bounds, q8_clamp_unit(x[i] * inverse)));
    *absmax = raw;
  } else {
    for (int64_t i = 0; i < len; ++i) codes[i] = static_cast<uint8_t>(q8_nearest_code(bounds, q8_clamp_unit(x[i] / clamped)));
    *absmax = clamped;
  }
}

template <typename Format, bool kStochastic, bool kTransform>
void adam_q8_block(const UpdateTensors& t, const Q8Moments& q, int64_t block, int64_t n, const AdamRule& rule,
                   const GradTransform& gt, uint32_t step_key, uint64_t first_index) {
  using Storage = typename Format::Storage;
  const int64_t lo = block * kQ8Block;
  const int64_t len = std::min(kQ8Block, n - lo);
  Storage* __restrict param = static_cast<Storage*>(t.param) + lo;
  const Storage* __restrict grad = static_cast<const Storage*>(t.grad) + lo;
  float* __restrict master = offset_or_null(t.master, lo);
  int16_t* __restrict remainder = offset_or_null(t.master_remainder, lo);
  const uint8_t* __restrict c1 = q.exp_avg + lo;
  const uint8_t* __restrict c2 = q.exp_avg_sq + lo;
  const float am1 = q.exp_avg_absmax[block];
  const float am2 = q.exp_avg_sq_absmax[block];
  alignas(64) float m[kQ8Block];
  alignas(64) float v[kQ8Block];
  for (int64_t i = 0; i < len; ++i) {
    m[i] = bits_float(kQ8SignedMap[c1[i]]) * am1;
    v[i] = bits_float(kQ8UnsignedMap[c2[i]]) * am2;
    float g = Format::widen(grad[i]);
    if (kTransform) g = transform_grad(g, gt);
    float p = load_param<Format>(param, master, remainder, i);
    float unused = 0.f;
    rule(p, g, m[i], v[i], unused);
    const uint32_t random = kStochastic ? rounding_random_keyed(step_key, first_index + static_cast<uint64_t>(lo + i)) : 0u;
    store_param<Format, kStochastic>(param, master, remainder, i, p, random);
  }
  quantise_block(m, len, kQ8SignedBounds, q.exp_avg + lo, q.exp_avg_absmax + block);
  quantise_block(v, len, kQ8UnsignedBounds, q.exp_avg_sq + lo, q.exp_avg_sq_absmax + block);
}

}  // namespace

void adam_update_q8(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                    const GradTransform& gt, const Rounding& r, int threads) {
  const uint32_t step_key = rounding_step_key(r.seed, r.step);
  const AdamRule rule{s};
  const int64_t blocks = q8_blocks(n);
  with_update_mode(t, r.stochastic, !is_identity(gt), [&](auto format, auto stochastic, auto transform) {
    using Format = decltype(format);
    const int team = team_size(n, threads);
    (void)team;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
#endif
    for (int64_t b = 0; b < blocks; ++b) {
      adam_q8_block<Format, decltype(stochastic)::value, decltype(transform)::value>(t, q, b, n, rule, gt, step_key,
                                                                                     r.first_index);
    }
  });
}

SHARDOPT_CPU_VARIANT_END
