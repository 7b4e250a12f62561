// kernels/cpu/update_cpu.cpp — the SGD and Adam/AdamW update loops over the shared rules, for f32 and bf16/f16 parameters, split across OpenMP threads; compiled once per ISA variant.
//
// The rules' flags, the element format and the rounding mode are loop-invariant; each is
// lifted into a template parameter so that the inner loop the compiler vectorises has no
// branches. This file is built with -ffp-contract=off: vector body and scalar tail then round
// identically, which keeps N-rank results bitwise equal to 1-rank results whatever the shard
// boundaries, and every ISA variant equal to the others. Arguments were checked by the public
// functions (dispatch_cpu.cpp).
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <type_traits>

#if SHARDOPT_CPU_HAS_F16C
#include <immintrin.h>
#endif

#include "cpu/loop_support.hpp"
#include "precision.hpp"

SHARDOPT_CPU_VARIANT_BEGIN
namespace {

using namespace cpu_loops;

// Calls body(begin, end, index_high, index_low) on the pieces of [begin, end) whose rounding
// indices (first_index + i) share their high 32 bits, so that the loops only do 32-bit
// arithmetic on the index. A range crosses such a boundary at most once per 2^32 elements.
template <typename Body>
void for_each_index_block(uint64_t first_index, int64_t begin, int64_t end, const Body& body) {
  int64_t b = begin;
  while (b < end) {
    const uint64_t index = first_index + static_cast<uint64_t>(b);
    const uint64_t to_boundary = (uint64_t{1} << 32) - (index & 0xffffffffu);
    const uint64_t left = static_cast<uint64_t>(end - b);
    const int64_t e = left <= to_boundary ? end : b + static_cast<int64_t>(to_boundary);
    body(b, e, static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(index));
    b = e;
  }
}

// ---- f16 through F16C ------------------------------------------------------------------------------
//
// GCC 12 vectorises the portable f16 conversions into long integer sequences: the f16 Adam loop
// ran at ~0.7 of its memory roofline where bf16 and f32 reach ~1. With F16C (the AVX2 and
// AVX-512 variants), nearest-even f16 updates instead widen a block of gradients into
// an L1-resident float buffer, run the f32-gradient loop writing the new values into another,
// and narrow those: vcvtph2ps/vcvtps2ph are IEEE conversions with the portable functions' exact
// bits, NaN payloads included (tests/unit compares the two paths).
#if SHARDOPT_CPU_HAS_F16C
constexpr bool kHaveF16C = true;
constexpr int64_t kStagedBlock = 1024;

// Gradients and new parameter values as floats in the block buffers; the master is the real one.
struct F32StagedFormat {
  using Storage = float;
  static constexpr DType kDType = DType::f16;
  static constexpr bool kHasMaster = true;
  static constexpr bool kRemainder = false;
  static float widen(float x) { return x; }
  static float narrow(float x) { return x; }
  static float narrow_stochastic(float x, uint32_t) { return x; }
};

void widen_f16_block(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}

void narrow_f16_block(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}

// Runs body(param_block, grad_block, offset, n) over [begin, end) in blocks, converting around it.
template <typename Body>
void f16_staged(uint16_t* param, const uint16_t* grad, int64_t begin, int64_t end, const Body& body) {
  alignas(64) float grads[kStagedBlock];
  alignas(64) float values[kStagedBlock];
  for (int64_t b = begin; b < end; b += kStagedBlock) {
    const int64_t n = std::min(kStagedBlock, end - b);
    widen_f16_block(grad + b, grads, n);
    body(values, grads, b, n);
    narrow_f16_block(values, param + b, n);
  }
}
#else
constexpr bool kHaveF16C = false;
#endif

template <typename Format, bool kStochastic>
constexpr bool kStagedF16 = kHaveF16C && std::is_same<Format, F16Format>::value && !kStochastic;

// One stretch of an update call that a rule loop runs over: `n` elements from `offset`, with
// the loop's element format (the stored one, or floats staged through F16C) and rounding key.
template <typename PieceFormat, bool kPieceStochastic>
struct UpdatePiece {
  using Format = PieceFormat;
  static constexpr bool kStochastic = kPieceStochastic;
  typename PieceFormat::Storage* param;
  const typename PieceFormat::Storage* grad;
  float* master;
  int16_t* remainder;
  int64_t offset;
  int64_t n;
  RoundingBlockKey key;
  uint32_t index_low;
};

// Walks [begin, end) of one update call in the pieces a rule loop takes, calling
// loop(UpdatePiece): f16 with nearest-even rounding in F16C-staged blocks where available,
// otherwise in pieces whose rounding indices share their high 32 bits.
template <typename Format, bool kStochastic, typename Loop>
void for_each_update_piece(const UpdateTensors& t, int64_t begin, int64_t end, uint64_t first_index,
                           uint32_t step_key, const Loop& loop) {
  using Storage = typename Format::Storage;
  Storage* param = static_cast<Storage*>(t.param);
  const Storage* grad = static_cast<const Storage*>(t.grad);
#if SHARDOPT_CPU_HAS_F16C
  if constexpr (kStagedF16<Format, kStochastic>) {
    f16_staged(param, grad, begin, end, [&](float* values, const float* grads, int64_t b, int64_t n) {
      loop(UpdatePiece<F32StagedFormat, false>{values, grads, t.master + b, nullptr, b, n, RoundingBlockKey{0u, 0u}, 0u});
    });
    return;
  }
#endif
  for_each_index_block(first_index, begin, end, [&](int64_t b, int64_t e, uint32_t high, uint32_t low) {
    const RoundingBlockKey key = kStochastic ? rounding_block_key(step_key, high) : RoundingBlockKey{0u, 0u};
    loop(UpdatePiece<Format, kStochastic>{param + b, grad + b, offset_or_null(t.master, b),
                                          offset_or_null(t.master_remainder, b), b, e - b, key, low});
  });
}

// A rule loop's elements [0, n): f32 parameters (the rule reads 4 arrays and writes 3) walk in
// parts (loop_support.hpp: more lines in flight; the f32 Adam step at world 2 took 0.65-1.05x,
// median about 0.86x, its time walking once, alternated 8 times). With a master beside 16-bit
// parameters 4 parts were slower (bf16 Adam 1.3x in 2 of 2 pairs), so those walk once.
template <typename Format, typename Body>
inline void walk_update(int64_t n, const Body& body) {
  if constexpr (std::is_same<Format, F32Format>::value) {
    walk_in_parts(0, n, body);
  } else {
    body(int64_t{0}, n);
  }
}

// The fp32 value element i's rule updates: the master, rebuilt from a remainder, or an f32
// parameter itself.
template <typename Format>
inline float load_value(const typename Format::Storage* param, const float* master, const int16_t* remainder,
                        int64_t i) {
  if constexpr (Format::kRemainder) return master_from_remainder(param[i], remainder[i]);
  else if constexpr (Format::kHasMaster) return master[i];
  else return param[i];
}

// Writes element i's updated value back where load_value read it (and the narrowed parameter).
template <typename Format, bool kStochastic>
inline void store_value(typename Format::Storage* param, float* master, int16_t* remainder, int64_t i, float p,
                        RoundingBlockKey key, uint32_t index_low) {
  if constexpr (Format::kRemainder) {
    param[i] = param_of_master(p);
    remainder[i] = remainder_of_master(p);
  } else if constexpr (Format::kHasMaster) {
    master[i] = p;
    const uint32_t random = kStochastic ? rounding_random_in_block(key, index_low + static_cast<uint32_t>(i)) : 0u;
    param[i] = narrow_param<Format, kStochastic>(p, random);
  } else {
    param[i] = p;
  }
}

// ---- SGD -----------------------------------------------------------------------------------------

// Momentum modes: what the momentum buffer does, with nesterov only where there is one.
enum SgdMode { kNoMomentum, kFirst, kFirstNesterov, kLater, kLaterNesterov };

template <typename F>
void with_sgd_mode(const SgdScalars& s, const F& f) {
  if (!s.use_momentum) f(std::integral_constant<int, kNoMomentum>{});
  else if (s.first_step && s.nesterov) f(std::integral_constant<int, kFirstNesterov>{});
  else if (s.first_step) f(std::integral_constant<int, kFirst>{});
  else if (s.nesterov) f(std::integral_constant<int, kLaterNesterov>{});
  else f(std::integral_constant<int, kLater>{});
}

// `master` is null for f32 (the parameter is its own master); element i of this piece has
// rounding random index (index_high, index_low + i).
template <typename Format, bool kStochastic, bool kTransform, bool kMaximize, bool kWeightDecay,
          int kMode>
void sgd_loop(typename Format::Storage* __restrict param,
              const typename Format::Storage* __restrict grad, float* __restrict master,
              int16_t* __restrict remainder, float* __restrict buf, int64_t n, SgdScalars s, GradTransform gt,
              RoundingBlockKey key, uint32_t index_low) {
  constexpr bool kMomentum = kMode != kNoMomentum;
  s.maximize = kMaximize;
  s.use_momentum = kMomentum;
  s.first_step = kMode == kFirst || kMode == kFirstNesterov;
  s.nesterov = kMode == kFirstNesterov || kMode == kLaterNesterov;
  if (!kWeightDecay) s.weight_decay = 0.f;
  const SgdRule rule{s};
  walk_update<Format>(n, [&](int64_t first, int64_t last) {
#pragma omp simd
    for (int64_t i = first; i < last; ++i) {
      float g = Format::widen(grad[i]);
      if (kTransform) g = transform_grad(g, gt);
      float p = load_value<Format>(param, master, remainder, i);
      if constexpr (kMomentum) {
        rule(p, g, buf[i]);
      } else {
        float unused = 0.f;
        rule(p, g, unused);
      }
      store_value<Format, kStochastic>(param, master, remainder, i, p, key, index_low);
    }
  });
}

template <typename Format, bool kStochastic, bool kTransform>
void sgd_range(const UpdateTensors& t, float* buf, int64_t begin, int64_t end, const SgdScalars& s,
               const GradTransform& gt, uint64_t first_index, uint32_t step_key) {
  for_each_update_piece<Format, kStochastic>(t, begin, end, first_index, step_key, [&](auto piece) {
    using P = decltype(piece);
    with_flag(s.maximize, [&](auto maximize) {
      with_flag(s.weight_decay != 0.f, [&](auto decay) {
        with_sgd_mode(s, [&](auto mode) {
          sgd_loop<typename P::Format, P::kStochastic, kTransform, decltype(maximize)::value,
                   decltype(decay)::value, decltype(mode)::value>(piece.param, piece.grad, piece.master,
                                                                  piece.remainder, offset_or_null(buf, piece.offset),
                                                                  piece.n,
                                                                  s, gt, piece.key, piece.index_low);
        });
      });
    });
  });
}

// ---- Adam / AdamW ----------------------------------------------------------------------------------

template <typename Format, bool kStochastic, bool kTransform, bool kMaximize, int kDecay,
          bool kAmsgrad>
void adam_loop(typename Format::Storage* __restrict param,
               const typename Format::Storage* __restrict grad, float* __restrict master,
               int16_t* __restrict remainder, float* __restrict m, float* __restrict v, float* __restrict vmax, int64_t n,
               AdamScalars s, GradTransform gt, RoundingBlockKey key, uint32_t index_low) {
  const AdamRule rule{fixed_adam_scalars<kMaximize, kDecay, kAmsgrad>(s)};
  walk_update<Format>(n, [&](int64_t first, int64_t last) {
#pragma omp simd
    for (int64_t i = first; i < last; ++i) {
      float g = Format::widen(grad[i]);
      if (kTransform) g = transform_grad(g, gt);
      float p = load_value<Format>(param, master, remainder, i);
      if constexpr (kAmsgrad) {
        rule(p, g, m[i], v[i], vmax[i]);
      } else {
        float unused = 0.f;
        rule(p, g, m[i], v[i], unused);
      }
      store_value<Format, kStochastic>(param, master, remainder, i, p, key, index_low);
    }
  });
}

template <typename Format, bool kStochastic, bool kTransform>
void adam_range(const UpdateTensors& t, float* m, float* v, float* vmax, int64_t begin,
                int64_t end, const AdamScalars& s, const GradTransform& gt, uint64_t first_index,
                uint32_t step_key) {
  for_each_update_piece<Format, kStochastic>(t, begin, end, first_index, step_key, [&](auto piece) {
    using P = decltype(piece);
    const int64_t b = piece.offset;
    with_flag(s.maximize, [&](auto maximize) {
      with_decay_mode(s, [&](auto decay) {
        with_flag(s.amsgrad, [&](auto amsgrad) {
          adam_loop<typename P::Format, P::kStochastic, kTransform, decltype(maximize)::value,
                    decltype(decay)::value, decltype(amsgrad)::value>(piece.param, piece.grad, piece.master,
                                                                      piece.remainder, m + b, v + b, offset_or_null(vmax, b),
                                                                      piece.n, s, gt, piece.key, piece.index_low);
        });
      });
    });
  });
}

}  // namespace

void sgd_update(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                const GradTransform& gt, const Rounding& r, int threads) {
  const uint32_t step_key = rounding_step_key(r.seed, r.step);
  with_update_mode(t, r.stochastic, !is_identity(gt), [&](auto format, auto stochastic, auto transform) {
    using Format = decltype(format);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
      sgd_range<Format, decltype(stochastic)::value, decltype(transform)::value>(
          t, momentum_buf, b, e, s, gt, r.first_index, step_key);
    });
  });
}

void adam_update(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq, int64_t n,
                 const AdamScalars& s, const GradTransform& gt, const Rounding& r, int threads) {
  const uint32_t step_key = rounding_step_key(r.seed, r.step);
  with_update_mode(t, r.stochastic, !is_identity(gt), [&](auto format, auto stochastic, auto transform) {
    using Format = decltype(format);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
      adam_range<Format, decltype(stochastic)::value, decltype(transform)::value>(
          t, exp_avg, exp_avg_sq, max_exp_avg_sq, b, e, s, gt, r.first_index, step_key);
    });
  });
}

SHARDOPT_CPU_VARIANT_END
