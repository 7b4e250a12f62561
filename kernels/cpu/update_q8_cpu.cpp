// kernels/cpu/update_q8_cpu.cpp — Adam/AdamW with 8-bit blockwise moments, fused per block (dequantise, update, new absmax, quantise); compiled once per ISA variant.
//
// Blocks are independent, so threads take whole blocks and results never depend on the thread
// count. Every operation is an IEEE float operation without contraction (-ffp-contract=off),
// a table lookup, or a comparison: every variant gives the same bits. The absmax is an exact
// maximum (order-free), with NaN tracked apart so that it propagates as torch's max does.
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if defined(SHARDOPT_CPU_VARIANT_AVX2) || defined(SHARDOPT_CPU_VARIANT_AVX512)
#include <immintrin.h>
#endif

#include "cpu/loop_support.hpp"
#include "cpu/q8_buckets.hpp"
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

// ---- one block's codes: dequantise, absmax, quantise ---------------------------------------------
//
// The vector paths (AVX-512: 16 lanes, AVX2: 8) and the scalar one run the same IEEE operations
// and table lookups per element (q8_buckets.hpp), so every variant writes the same bytes.

inline uint8_t nearest_code(float x, const Q8BucketTable& table, Q8BucketShape shape) {
  if (x != x) return 255;  // as the binary search: NaN passes every midpoint
  return static_cast<uint8_t>(q8_bucket_code(float_bits(x), table, shape));
}

// Elements [from, len) of one moment's block, one at a time.
inline void dequantise_scalar(const uint8_t* codes, const uint32_t* map, float absmax, float* x, int64_t from,
                              int64_t len) {
  for (int64_t i = from; i < len; ++i) x[i] = bits_float(map[codes[i]]) * absmax;
}

struct Q8Search {
  const Q8BucketTable& table;
  Q8BucketShape shape;
};

// x * inverse (full block) or x / clamped (partial block), clamped to [-1, 1], to its code.
template <bool kFull>
inline uint8_t scaled_code(float x, float inverse, float clamped, const Q8Search& q) {
  const float scaled = kFull ? x * inverse : x / clamped;
  return nearest_code(q8_clamp_unit(scaled), q.table, q.shape);
}

// Elements [from, len) of a block's codes, one at a time.
template <bool kFull>
inline void quantise_scalar(const float* x, int64_t from, int64_t len, float inverse, float clamped, const Q8Search& q,
                            uint8_t* codes) {
  for (int64_t i = from; i < len; ++i) codes[i] = scaled_code<kFull>(x[i], inverse, clamped, q);
}

#if defined(SHARDOPT_CPU_VARIANT_AVX512)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized
// reports once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
constexpr int64_t kLanes = 16;

inline void dequantise(const uint8_t* codes, const uint32_t* map, float absmax, float* x, int64_t len) {
  const __m512 scale = _mm512_set1_ps(absmax);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    _mm512_store_ps(x + i, _mm512_mul_ps(_mm512_i32gather_ps(index, map, 4), scale));
  }
  dequantise_scalar(codes, map, absmax, x, i, len);
}

template <bool kFull>
inline void quantise_codes(const float* x, int64_t len, float inverse, float clamped, const Q8Search& q,
                           uint8_t* codes) {
  const __m512 vinverse = _mm512_set1_ps(inverse), vclamped = _mm512_set1_ps(clamped);
  const __m512 one = _mm512_set1_ps(1.f), minus_one = _mm512_set1_ps(-1.f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i base = _mm512_set1_epi32(static_cast<int>(q.shape.base));
  const __m512i all_codes = _mm512_set1_epi32(255), one_code = _mm512_set1_epi32(1), byte = _mm512_set1_epi32(0xff);
  const __m512i inside = _mm512_set1_epi32(static_cast<int>((1u << q.shape.shift) - 1u));
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(q.shape.shift));
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const __m512 raw = _mm512_load_ps(x + i);
    __m512 s = kFull ? _mm512_mul_ps(raw, vinverse) : _mm512_div_ps(raw, vclamped);
    s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, one, _CMP_GT_OQ), one);
    s = _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(s, minus_one, _CMP_LT_OQ), minus_one);
    const __mmask16 nan = _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q);
    const __m512i bits = _mm512_castps_si512(s);
    const __m512i key = _mm512_max_epu32(_mm512_xor_si512(bits, _mm512_or_si512(_mm512_srai_epi32(bits, 31), sign)), base);
    const __m512i from_base = _mm512_sub_epi32(key, base);
    const __m512i bucket = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), _mm512_srl_epi32(from_base, shift));
    const __m512i entry = _mm512_i32gather_epi32(bucket, q.table.entry.data(), 4);
    const __m512i below = _mm512_and_si512(entry, byte);
    const __mmask16 above = _mm512_cmpgt_epu32_mask(_mm512_and_si512(from_base, inside), _mm512_srli_epi32(entry, 8));
    __m512i code = _mm512_mask_add_epi32(below, above, below, one_code);
    code = _mm512_mask_mov_epi32(code, nan, all_codes);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  // A full block is whole vectors; only a partial one has a tail.
  if constexpr (!kFull) quantise_scalar<kFull>(x, i, len, inverse, clamped, q, codes);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#elif defined(SHARDOPT_CPU_VARIANT_AVX2)
constexpr int64_t kLanes = 8;

inline void dequantise(const uint8_t* codes, const uint32_t* map, float absmax, float* x, int64_t len) {
  const __m256 scale = _mm256_set1_ps(absmax);
  const auto* table = reinterpret_cast<const float*>(map);
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const __m256i index = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_store_ps(x + i, _mm256_mul_ps(_mm256_i32gather_ps(table, index, 4), scale));
  }
  dequantise_scalar(codes, map, absmax, x, i, len);
}

template <bool kFull>
inline void quantise_codes(const float* x, int64_t len, float inverse, float clamped, const Q8Search& q,
                           uint8_t* codes) {
  const __m256 vinverse = _mm256_set1_ps(inverse), vclamped = _mm256_set1_ps(clamped);
  const __m256 one = _mm256_set1_ps(1.f), minus_one = _mm256_set1_ps(-1.f);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i base = _mm256_set1_epi32(static_cast<int>(q.shape.base));
  const __m256i all_codes = _mm256_set1_epi32(255), byte = _mm256_set1_epi32(0xff);
  const __m256i inside = _mm256_set1_epi32(static_cast<int>((1u << q.shape.shift) - 1u));
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(q.shape.shift));
  // Byte 0 of each 32-bit lane to the low 4 bytes of its 128-bit half.
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                                        -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const auto* table = reinterpret_cast<const int*>(q.table.entry.data());
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    const __m256 raw = _mm256_load_ps(x + i);
    __m256 s = kFull ? _mm256_mul_ps(raw, vinverse) : _mm256_div_ps(raw, vclamped);
    s = _mm256_blendv_ps(s, one, _mm256_cmp_ps(s, one, _CMP_GT_OQ));
    s = _mm256_blendv_ps(s, minus_one, _mm256_cmp_ps(s, minus_one, _CMP_LT_OQ));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(s, s, _CMP_UNORD_Q));
    const __m256i bits = _mm256_castps_si256(s);
    const __m256i key = _mm256_max_epu32(_mm256_xor_si256(bits, _mm256_or_si256(_mm256_srai_epi32(bits, 31), sign)), base);
    const __m256i from_base = _mm256_sub_epi32(key, base);
    const __m256i bucket = _mm256_andnot_si256(nan, _mm256_srl_epi32(from_base, shift));
    const __m256i entry = _mm256_i32gather_epi32(table, bucket, 4);
    // Both sides are below 2^24, so the signed comparison is the unsigned one; its all-ones
    // lanes are -1: subtracting adds one.
    const __m256i above = _mm256_cmpgt_epi32(_mm256_and_si256(from_base, inside), _mm256_srli_epi32(entry, 8));
    __m256i code = _mm256_sub_epi32(_mm256_and_si256(entry, byte), above);
    code = _mm256_blendv_epi8(code, all_codes, nan);
    const __m256i packed = _mm256_shuffle_epi8(code, pick);
    const uint32_t low = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_castsi256_si128(packed)));
    const uint32_t high = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(packed, 1)));
    std::memcpy(codes + i, &low, 4);
    std::memcpy(codes + i + 4, &high, 4);
  }
  // A full block is whole vectors; only a partial one has a tail.
  if constexpr (!kFull) quantise_scalar<kFull>(x, i, len, inverse, clamped, q, codes);
}

#else
inline void dequantise(const uint8_t* codes, const uint32_t* map, float absmax, float* x, int64_t len) {
  dequantise_scalar(codes, map, absmax, x, 0, len);
}

template <bool kFull>
inline void quantise_codes(const float* x, int64_t len, float inverse, float clamped, const Q8Search& q,
                           uint8_t* codes) {
  quantise_scalar<kFull>(x, 0, len, inverse, clamped, q, codes);
}
#endif

// The bits of |x| as an unsigned integer: ordered as |x| for every non-NaN x, and above every
// one of them (above inf's 0x7f800000) for a NaN. So their maximum over a block, an exact and
// order-free integer reduction, is the block's max |x| or says that a value was NaN.
inline uint32_t magnitude_bits(float x) { return float_bits(x) & 0x7fffffffu; }

// One moment's block: the new absmax (NaN when any value is NaN: `largest_bits`, the maximum of
// magnitude_bits over it, is past inf) and the codes.
inline void quantise_block(const float* x, int64_t len, uint32_t largest_bits, const Q8Search& q, uint8_t* codes,
                           float* absmax) {
  const bool nan = largest_bits > 0x7f800000u;
  const float raw = nan ? std::numeric_limits<float>::quiet_NaN() : bits_float(largest_bits);
  const float clamped = q8_clamp_below(raw, bits_float(kQ8AbsmaxFloorBits));
  if (len == kQ8Block) {
    quantise_codes<true>(x, len, 1.f / clamped, clamped, q, codes);
    *absmax = raw;
  } else {
    quantise_codes<false>(x, len, 0.f, clamped, q, codes);
    *absmax = clamped;
  }
}

const Q8Search kSignedSearch{kQ8SignedBucketTable, kQ8SignedBuckets};
const Q8Search kUnsignedSearch{kQ8UnsignedBucketTable, kQ8UnsignedBuckets};

// The largest magnitude_bits of each moment over a block.
struct MomentMaxima {
  uint32_t m = 0, v = 0;
};

// The rule over one block's dequantised moments: flags as template parameters and no table
// lookups, so that the loop vectorises as update_cpu.cpp's does. The moments' maxima are taken
// as they are written, sparing a second pass over them.
template <typename Format, bool kStochastic, bool kTransform, bool kMaximize, int kDecay>
MomentMaxima adam_q8_values(typename Format::Storage* __restrict param, const typename Format::Storage* __restrict grad,
                            float* __restrict master, int16_t* __restrict remainder, float* __restrict m,
                            float* __restrict v, int64_t len, const AdamScalars& scalars, const GradTransform& gt,
                            uint32_t step_key, uint64_t first_index) {
  const AdamRule rule{fixed_adam_scalars<kMaximize, kDecay, false>(scalars)};
  uint32_t m_largest = 0, v_largest = 0;
#pragma omp simd reduction(max : m_largest, v_largest)
  for (int64_t i = 0; i < len; ++i) {
    float g = Format::widen(grad[i]);
    if (kTransform) g = transform_grad(g, gt);
    float p = load_param<Format>(param, master, remainder, i);
    float unused = 0.f;
    rule(p, g, m[i], v[i], unused);
    const uint32_t random = kStochastic ? rounding_random_keyed(step_key, first_index + static_cast<uint64_t>(i)) : 0u;
    store_param<Format, kStochastic>(param, master, remainder, i, p, random);
    m_largest = std::max(m_largest, magnitude_bits(m[i]));
    v_largest = std::max(v_largest, magnitude_bits(v[i]));
  }
  return MomentMaxima{m_largest, v_largest};
}

// Blocks ahead whose streams are prefetched: one block's compute is short next to a DRAM
// round trip, and the hardware prefetcher follows few of the block's five streams far enough.
constexpr int64_t kPrefetchBlocks = 4;

inline void prefetch_span(const void* base, int64_t byte_offset, int64_t bytes) {
  if (base == nullptr) return;
  const char* first = static_cast<const char*>(base) + byte_offset;
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(first + line, 1, 3);
}

// The streams of block `block` (if it exists): codes of both moments, gradient, parameter,
// master or remainder. Prefetching changes no value.
template <typename Format>
inline void prefetch_block(const UpdateTensors& t, const Q8Moments& q, int64_t block, int64_t n) {
  const int64_t lo = block * kQ8Block;
  if (lo >= n) return;
  const int64_t len = std::min(kQ8Block, n - lo);
  constexpr int64_t kStorage = sizeof(typename Format::Storage);
  prefetch_span(q.exp_avg, lo, len);
  prefetch_span(q.exp_avg_sq, lo, len);
  prefetch_span(t.grad, lo * kStorage, len * kStorage);
  prefetch_span(t.param, lo * kStorage, len * kStorage);
  if constexpr (Format::kRemainder) prefetch_span(t.master_remainder, lo * 2, len * 2);
  else if constexpr (Format::kHasMaster) prefetch_span(t.master, lo * 4, len * 4);
}

template <typename Format, bool kStochastic, bool kTransform, bool kMaximize, int kDecay>
void adam_q8_block(const UpdateTensors& t, const Q8Moments& q, int64_t block, int64_t n, const AdamScalars& s,
                   const GradTransform& gt, uint32_t step_key, uint64_t first_index) {
  using Storage = typename Format::Storage;
  const int64_t lo = block * kQ8Block;
  const int64_t len = std::min(kQ8Block, n - lo);
  alignas(64) float m[kQ8Block];
  alignas(64) float v[kQ8Block];
  prefetch_block<Format>(t, q, block + kPrefetchBlocks, n);
  dequantise(q.exp_avg + lo, kQ8SignedMap, q.exp_avg_absmax[block], m, len);
  dequantise(q.exp_avg_sq + lo, kQ8UnsignedMap, q.exp_avg_sq_absmax[block], v, len);
  const MomentMaxima largest = adam_q8_values<Format, kStochastic, kTransform, kMaximize, kDecay>(
      static_cast<Storage*>(t.param) + lo, static_cast<const Storage*>(t.grad) + lo, offset_or_null(t.master, lo),
      offset_or_null(t.master_remainder, lo), m, v, len, s, gt, step_key, first_index + static_cast<uint64_t>(lo));
  quantise_block(m, len, largest.m, kSignedSearch, q.exp_avg + lo, q.exp_avg_absmax + block);
  quantise_block(v, len, largest.v, kUnsignedSearch, q.exp_avg_sq + lo, q.exp_avg_sq_absmax + block);
}

}  // namespace

void adam_update_q8(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                    const GradTransform& gt, const Rounding& r, int threads) {
  const uint32_t step_key = rounding_step_key(r.seed, r.step);
  const int64_t blocks = q8_blocks(n);
  with_update_mode(t, r.stochastic, !is_identity(gt), [&](auto format, auto stochastic, auto transform) {
    with_flag(s.maximize, [&](auto maximize) {
      with_decay_mode(s, [&](auto decay) {
        const int team = team_size(n, threads);
        (void)team;
#ifdef _OPENMP
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
#endif
        for (int64_t b = 0; b < blocks; ++b) {
          adam_q8_block<decltype(format), decltype(stochastic)::value, decltype(transform)::value,
                        decltype(maximize)::value, decltype(decay)::value>(t, q, b, n, s, gt, step_key, r.first_index);
        }
      });
    });
  });
}

SHARDOPT_CPU_VARIANT_END
