// tests/unit/test_precision.cpp — bf16/f16 conversions against independent references, stochastic rounding and the rounding random bits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "precision.hpp"

using namespace shardopt::kernels;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// ---- bf16 reference: the nearer of the two bf16 neighbours, distances measured in double ----

double bf16_pattern_value(uint32_t top16) { return static_cast<double>(from_bits(top16 << 16)); }

uint16_t reference_bf16(float x) {
  const uint32_t u = to_bits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t magnitude = u & 0x7fffffffu;
  const uint32_t below = magnitude >> 16;  // toward zero
  if ((below << 16) == magnitude) return static_cast<uint16_t>((sign >> 16) | below);
  const uint32_t above = below + 1;  // away from zero: may be the infinity pattern
  const double ax = std::fabs(static_cast<double>(x));
  const double low = bf16_pattern_value(below);
  // IEEE: a value rounds to inf when it is at least max + half an ulp, i.e. inf counts as 2^128.
  const double high = above == 0x7f80u ? std::ldexp(1.0, 128) : bf16_pattern_value(above);
  const double to_low = ax - low;  // exact in double
  const double to_high = high - ax;
  uint32_t pick;
  if (to_low < to_high) pick = below;
  else if (to_high < to_low) pick = above;
  else pick = (below & 1u) == 0u ? below : above;
  return static_cast<uint16_t>((sign >> 16) | pick);
}

// ---- f16 reference: GCC's _Float16 conversions (x86's F16C instructions where available) ----

#if defined(__x86_64__) && defined(__FLT16_MAX__)
#define SHARDOPT_TEST_HAVE_FLOAT16 1

uint16_t f16_bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
_Float16 f16_from(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof h);
  return h;
}

// Software conversion (libgcc): always there, slow (~100 ns).
uint16_t gcc_f16_soft(float x) { return f16_bits(static_cast<_Float16>(x)); }
float gcc_f16_to_float_soft(uint16_t h) { return static_cast<float>(f16_from(h)); }

// The same cast compiled for F16C: one vcvtps2ph, fast enough to sweep many floats.
__attribute__((target("f16c"))) uint16_t gcc_f16_hw(float x) { return f16_bits(static_cast<_Float16>(x)); }

bool have_f16c() { return __builtin_cpu_supports("f16c"); }

uint16_t gcc_f16(float x) { return have_f16c() ? gcc_f16_hw(x) : gcc_f16_soft(x); }

// Counts disagreements of float_to_f16 with GCC's cast over floats u = first, first+stride, ...
template <typename Reference>
uint64_t f16_mismatches(uint64_t first, uint64_t count, uint64_t stride, Reference reference) {
  uint64_t bad = 0;
  for (uint64_t k = 0; k < count; ++k) {
    const float x = from_bits(static_cast<uint32_t>(first + k * stride));
    bad += float_to_f16(x) != reference(x) ? 1u : 0u;
  }
  return bad;
}

__attribute__((target("f16c"))) uint64_t f16_mismatches_hw(uint64_t first, uint64_t count, uint64_t stride) {
  uint64_t bad = 0;
  for (uint64_t k = 0; k < count; ++k) {
    const float x = from_bits(static_cast<uint32_t>(first + k * stride));
    bad += float_to_f16(x) != f16_bits(static_cast<_Float16>(x)) ? 1u : 0u;
  }
  return bad;
}
#endif

bool is_bf16_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0u; }
bool is_f16_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u; }

// Mean of `draws` stochastic roundings of x (indices 0..draws-1), and the standard error of a
// mean of Bernoulli choices between the two neighbours lo < hi around x.
struct Draws {
  double mean;
  double standard_error;
};

template <typename Round, typename Widen>
Draws draw_mean(float x, int draws, uint64_t seed, Round round, Widen widen, double lo, double hi) {
  double sum = 0.0;
  for (int i = 0; i < draws; ++i) {
    const double value = widen(round(x, rounding_random(seed, 7, static_cast<uint64_t>(i))));
    REQUIRE((value == lo || value == hi));
    sum += value;
  }
  const double p = (static_cast<double>(x) - lo) / (hi - lo);
  return Draws{sum / draws, (hi - lo) * std::sqrt(p * (1.0 - p) / draws)};
}

}  // namespace

// ---- bf16 ------------------------------------------------------------------------------------------

TEST_CASE("every bf16 value widens exactly and rounds back to itself", "[precision][bf16]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_float(static_cast<uint16_t>(h));
    REQUIRE(to_bits(x) == h << 16);
    const uint16_t back = float_to_bf16(x);
    if (is_bf16_nan(static_cast<uint16_t>(h))) {
      REQUIRE(back == (h | 0x40u));  // quietened, sign and payload kept
    } else {
      REQUIRE(back == h);
    }
  }
}

TEST_CASE("float_to_bf16 is round-to-nearest-even (edge cases)", "[precision][bf16]") {
  struct Case {
    uint32_t in;
    uint16_t out;
  };
  const Case cases[] = {
      {0x3f800000u, 0x3f80u},  // 1
      {0x3f808000u, 0x3f80u},  // tie, even stays
      {0x3f818000u, 0x3f82u},  // tie, odd goes up
      {0x3f808001u, 0x3f81u},  // just above the tie
      {0x3f807fffu, 0x3f80u},  // just below
      {0xbf818000u, 0xbf82u},  // negative tie, odd
      {0x7f7f0000u, 0x7f7fu},  // largest finite bf16
      {0x7f7f7fffu, 0x7f7fu},  // below the overflow tie
      {0x7f7f8000u, 0x7f80u},  // overflow tie (odd) -> inf
      {0x7f7fffffu, 0x7f80u},  // largest float -> inf
      {0xff7fffffu, 0xff80u},  // -> -inf
      {0x7f800000u, 0x7f80u},  // inf
      {0xff800000u, 0xff80u},  // -inf
      {0x7fc00000u, 0x7fc0u},  // quiet NaN
      {0x7f800001u, 0x7fc0u},  // signalling NaN, low payload: quietened
      {0xffa00000u, 0xffe0u},  // negative signalling NaN keeps sign and top payload
      {0x7fffffffu, 0x7fffu},  // NaN with all payload bits: no carry into the sign
      {0x00000000u, 0x0000u},  // +0
      {0x80000000u, 0x8000u},  // -0
      {0x00008000u, 0x0000u},  // subnormal tie to even zero
      {0x00018000u, 0x0002u},  // subnormal tie, odd -> up
      {0x00008001u, 0x0001u},  // smallest subnormal bf16 reached from above the tie
      {0x807fffffu, 0x8080u},  // largest negative subnormal float rounds to -2^-126
  };
  for (const Case& c : cases) {
    CAPTURE(c.in);
    REQUIRE(float_to_bf16(from_bits(c.in)) == c.out);
    if (!std::isnan(from_bits(c.in))) REQUIRE(reference_bf16(from_bits(c.in)) == c.out);
  }
}

TEST_CASE("float_to_bf16 matches the nearest-neighbour reference on random floats", "[precision][bf16]") {
  std::mt19937 gen(11);
  uint64_t bad = 0;
  for (int i = 0; i < 4'000'000; ++i) {
    // Random bit patterns cover every exponent; half of them get a tie-ish low half.
    uint32_t u = gen();
    if (i % 2) u = (u & 0xffff0000u) | (0x8000u + (gen() % 3) - 1);
    const float x = from_bits(u);
    const uint16_t got = float_to_bf16(x);
    if (std::isnan(x)) {
      bad += (is_bf16_nan(got) && (got & 0x8000u) == ((u >> 16) & 0x8000u)) ? 0 : 1;
    } else {
      bad += got != reference_bf16(x) ? 1 : 0;
    }
  }
  REQUIRE(bad == 0);
  // And every float whose top half is a few chosen values, with every low half.
  for (uint32_t top : {0x0000u, 0x0001u, 0x3f80u, 0x3f81u, 0x7f7eu, 0x7f7fu, 0x807fu, 0xc2f1u}) {
    for (uint32_t low = 0; low < 65536; ++low) {
      const float x = from_bits((top << 16) | low);
      REQUIRE(float_to_bf16(x) == reference_bf16(x));
    }
  }
}

// ---- f16 ---------------------------------------------------------------------------------------------

#if SHARDOPT_TEST_HAVE_FLOAT16

TEST_CASE("every f16 value widens exactly (GCC's _Float16) and rounds back to itself", "[precision][f16]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    CAPTURE(h);
    const uint16_t bits = static_cast<uint16_t>(h);
    const float mine = f16_to_float(bits);
    const float gcc = gcc_f16_to_float_soft(bits);
    if (is_f16_nan(bits)) {
      REQUIRE(std::isnan(mine));
      REQUIRE(std::signbit(mine) == std::signbit(gcc));
      REQUIRE((to_bits(mine) | 0x00400000u) == (to_bits(gcc) | 0x00400000u));  // payload kept
      REQUIRE(float_to_f16(mine) == (h | 0x200u));
    } else {
      REQUIRE(to_bits(mine) == to_bits(gcc));
      REQUIRE(float_to_f16(mine) == h);
    }
  }
}

TEST_CASE("float_to_f16 equals GCC's _Float16 cast at every tie point and its neighbours", "[precision][f16]") {
  uint64_t bad = 0;
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    // The midpoint between h and the next magnitude is exact in float (12 significant bits);
    // above 65504 the "next" is 65536, where values round to inf.
    const double lo = f16_to_float(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00u ? 65536.0 : f16_to_float(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    for (float x : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f), static_cast<float>(lo)}) {
      for (float s : {x, -x}) {
        if (float_to_f16(s) != gcc_f16(s)) {
          ++bad;
          UNSCOPED_INFO("x bits " << to_bits(s));
        }
      }
    }
  }
  REQUIRE(bad == 0);
  REQUIRE(float_to_f16(65519.996f) == 0x7bffu);
  REQUIRE(float_to_f16(65520.f) == 0x7c00u);
  REQUIRE(float_to_f16(from_bits(0x33000000u)) == 0x0000u);  // 2^-25: tie to even zero
  REQUIRE(float_to_f16(from_bits(0x33000001u)) == 0x0001u);
  REQUIRE(float_to_f16(from_bits(0x80000001u)) == 0x8000u);  // float subnormal -> -0
  REQUIRE(float_to_f16(from_bits(0x7f800001u)) == 0x7e00u);  // sNaN quietened
  REQUIRE(float_to_f16(from_bits(0xffc00000u)) == 0xfe00u);
}

TEST_CASE("float_to_f16 equals GCC's _Float16 cast over a sweep of all float bit patterns", "[precision][f16]") {
  // Every 61st pattern (70 million floats, every exponent and many low halves) with F16C;
  // a sparser sweep with libgcc's software conversion where F16C is missing.
  const uint64_t stride = have_f16c() ? 61 : 4099;
  const uint64_t count = (uint64_t{1} << 32) / stride;
  const uint64_t bad = have_f16c() ? f16_mismatches_hw(0, count, stride)
                                   : f16_mismatches(0, count, stride, gcc_f16_soft);
  REQUIRE(bad == 0);
}

// All 2^32 floats: about 20 s with F16C on one core, so only on request:
//   shardopt-unit-tests "[.exhaustive]"
TEST_CASE("float_to_f16 equals GCC's _Float16 cast for every float", "[.exhaustive][precision][f16]") {
  if (!have_f16c()) {
    WARN("no F16C: the exhaustive comparison would take minutes; skipped");
    return;
  }
  uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t block = 0; block < 65536; ++block) bad += f16_mismatches_hw(static_cast<uint64_t>(block) << 16, 65536, 1);
  REQUIRE(bad == 0);
}

#else

TEST_CASE("f16 conversions against _Float16", "[precision][f16]") {
  WARN("this compiler has no _Float16 on this target: f16 reference tests skipped");
}

#endif

TEST_CASE("f16 conversions by hand", "[precision][f16]") {
  REQUIRE(f16_to_float(0x3c00u) == 1.f);
  REQUIRE(f16_to_float(0x7bffu) == 65504.f);
  REQUIRE(f16_to_float(0x0001u) == std::ldexp(1.f, -24));
  REQUIRE(f16_to_float(0x03ffu) == 1023 * std::ldexp(1.f, -24));
  REQUIRE(std::signbit(f16_to_float(0x8000u)));
  REQUIRE(std::isinf(f16_to_float(0xfc00u)));
  REQUIRE(float_to_f16(1.f + std::ldexp(1.f, -11)) == 0x3c00u);           // tie, even
  REQUIRE(float_to_f16(1.f + 3 * std::ldexp(1.f, -11)) == 0x3c02u);       // tie, odd -> up
  REQUIRE(float_to_f16(std::ldexp(1.5f, -24)) == 0x0002u);                // subnormal tie, odd -> up
  REQUIRE(float_to_f16(std::ldexp(2.5f, -24)) == 0x0002u);                // subnormal tie, even
  REQUIRE(float_to_f16(std::ldexp(1.f, -14) * (1.f - std::ldexp(1.f, -12))) == 0x0400u);  // up into normal
  REQUIRE(float_to_f16(1e10f) == 0x7c00u);
  REQUIRE(float_to_f16(-1e10f) == 0xfc00u);
}

// ---- stochastic rounding ---------------------------------------------------------------------------

TEST_CASE("rounding_random is a pure function of (seed, step, index) that varies with each", "[precision][random]") {
  int same_seed = 0, same_step = 0, same_next = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    REQUIRE(rounding_random(42, 3, i) == rounding_random(42, 3, i));
    same_seed += rounding_random(42, 3, i) == rounding_random(43, 3, i);
    same_step += rounding_random(42, 3, i) == rounding_random(42, 4, i);
    same_next += rounding_random(42, 3, i) == rounding_random(42, 3, i + 1);
  }
  REQUIRE(same_seed <= 1);
  REQUIRE(same_step <= 1);
  REQUIRE(same_next <= 1);
  // High words of every input matter too.
  REQUIRE(rounding_random(1, 0, 5) != rounding_random(1 + (uint64_t{1} << 32), 0, 5));
  REQUIRE(rounding_random(1, 0, 5) != rounding_random(1, uint64_t{1} << 32, 5));
  REQUIRE(rounding_random(1, 0, 5) != rounding_random(1, 0, 5 + (uint64_t{1} << 32)));
  // The keyed forms the loops use are the same function.
  const uint32_t key = rounding_step_key(9, 10);
  for (uint64_t index : {uint64_t{0}, uint64_t{77}, (uint64_t{3} << 32) + 5}) {
    REQUIRE(rounding_random_keyed(key, index) == rounding_random(9, 10, index));
    REQUIRE(rounding_random_in_block(rounding_block_key(key, static_cast<uint32_t>(index >> 32)),
                                     static_cast<uint32_t>(index)) == rounding_random(9, 10, index));
  }
}

TEST_CASE("rounding_random bits look uniform", "[precision][random]") {
  // Each of the 32 bits is set about half the time over consecutive indices (the case that
  // matters: a shard's elements), to within 5 standard errors.
  const int n = 100000;
  int ones[32] = {};
  for (int i = 0; i < n; ++i) {
    const uint32_t r = rounding_random(2024, 1, static_cast<uint64_t>(i));
    for (int b = 0; b < 32; ++b) ones[b] += (r >> b) & 1u;
  }
  const double se = std::sqrt(0.25 / n);
  for (int b = 0; b < 32; ++b) {
    CAPTURE(b);
    REQUIRE(std::fabs(static_cast<double>(ones[b]) / n - 0.5) < 5 * se);
  }
  // Neighbouring indices, and the same index at the next step, share about half their bits.
  const auto agreement = [&](auto other) {
    double agree = 0;
    for (int i = 0; i < n; ++i) {
      const uint32_t same = ~(rounding_random(2024, 1, static_cast<uint64_t>(i)) ^ other(static_cast<uint64_t>(i)));
      agree += __builtin_popcount(same);
    }
    return agree / (32.0 * n);
  };
  const double se_bits = std::sqrt(0.25 / (32.0 * n));
  REQUIRE(std::fabs(agreement([](uint64_t i) { return rounding_random(2024, 1, i + 1); }) - 0.5) < 5 * se_bits);
  REQUIRE(std::fabs(agreement([](uint64_t i) { return rounding_random(2024, 2, i); }) - 0.5) < 5 * se_bits);
}

TEST_CASE("stochastic bf16 rounding is unbiased and reproducible", "[precision][random][bf16]") {
  const auto widen = [](uint16_t h) { return static_cast<double>(bf16_to_float(h)); };
  const auto round = [](float x, uint32_t r) { return float_to_bf16_stochastic(x, r); };
  const double ulp1 = std::ldexp(1.0, -7);
  const float values[] = {static_cast<float>(1.0 + 0.3 * ulp1), static_cast<float>(-(1.0 + 0.71 * ulp1)),
                          std::ldexp(1.37f, -130) /* subnormal */, 3.0e38f /* top binade */};
  for (const float x : values) {
    // The bf16 neighbours of x: its top half, and one more in magnitude.
    const uint32_t toward_zero = to_bits(x) >> 16;
    const double a = bf16_to_float(static_cast<uint16_t>(toward_zero));
    const double b = bf16_to_float(static_cast<uint16_t>(toward_zero + 1));
    CAPTURE(x, a, b);
    const Draws d = draw_mean(x, 100000, 5, round, widen, std::min(a, b), std::max(a, b));
    REQUIRE(std::fabs(d.mean - x) < 5 * d.standard_error);
  }
  // Exactly representable values never move; inf and NaN stay.
  for (uint32_t r : {0u, 0xffffu, 0xffffffffu, 0x12345678u}) {
    REQUIRE(float_to_bf16_stochastic(1.5f, r) == 0x3fc0u);
    REQUIRE(float_to_bf16_stochastic(-0.f, r) == 0x8000u);
    REQUIRE(float_to_bf16_stochastic(INFINITY, r) == 0x7f80u);
    REQUIRE(float_to_bf16_stochastic(-INFINITY, r) == 0xff80u);
    REQUIRE(is_bf16_nan(float_to_bf16_stochastic(NAN, r)));
    REQUIRE(is_bf16_nan(float_to_bf16_stochastic(from_bits(0x7f800001u), r)));
  }
  // The contract: the low 16 random bits are added to the 16 dropped bits.
  REQUIRE(float_to_bf16_stochastic(from_bits(0x3f80c000u), 0x3fffu) == 0x3f80u);
  REQUIRE(float_to_bf16_stochastic(from_bits(0x3f80c000u), 0x4000u) == 0x3f81u);
  REQUIRE(float_to_bf16_stochastic(from_bits(0x3f80c000u), 0xffff0000u) == 0x3f80u);  // high bits unused
}

TEST_CASE("stochastic f16 rounding is unbiased, subnormals included", "[precision][random][f16]") {
  const auto widen = [](uint16_t h) { return static_cast<double>(f16_to_float(h)); };
  const auto round = [](float x, uint32_t r) { return float_to_f16_stochastic(x, r); };
  const double ulp1 = std::ldexp(1.0, -10);
  const double sub = std::ldexp(1.0, -24);  // smallest subnormal
  struct Case {
    double x, lo, hi;
  };
  const Case cases[] = {
      {1.0 + 0.3 * ulp1, 1.0, 1.0 + ulp1},
      {-(1000.0 + 0.55), -1001.0, -1000.5},        // ulp 0.5 at 1000
      {2.3 * sub, 2 * sub, 3 * sub},               // subnormal
      {0.37 * sub, 0.0, sub},                      // below the smallest subnormal
      {0.01 * sub, 0.0, sub},                      // far below it (27 dropped bits)
      {std::ldexp(1.0, -14) - 0.5 * sub, std::ldexp(1.0, -14) - sub, std::ldexp(1.0, -14)},  // top of the subnormals
      {65500.0, 65472.0, 65504.0},                 // last finite interval
  };
  for (const Case& c : cases) {
    const float x = static_cast<float>(c.x);
    CAPTURE(c.x);
    const Draws d = draw_mean(x, 100000, 9, round, widen, c.lo, c.hi);
    REQUIRE(std::fabs(d.mean - static_cast<double>(x)) < 5 * d.standard_error);
  }
  // Beyond the largest finite value: nearest-even (65504 up to 65520, inf from there).
  for (uint32_t r : {0u, 0x80000000u, 0xffffffffu}) {
    REQUIRE(float_to_f16_stochastic(65510.f, r) == 0x7bffu);
    REQUIRE(float_to_f16_stochastic(65520.f, r) == 0x7c00u);
    REQUIRE(float_to_f16_stochastic(-1e6f, r) == 0xfc00u);
    REQUIRE(float_to_f16_stochastic(INFINITY, r) == 0x7c00u);
    REQUIRE(is_f16_nan(float_to_f16_stochastic(NAN, r)));
    REQUIRE(float_to_f16_stochastic(65504.f, r) == 0x7bffu);
    REQUIRE(float_to_f16_stochastic(0.5f, r) == 0x3800u);
    REQUIRE(float_to_f16_stochastic(-0.f, r) == 0x8000u);
    REQUIRE(float_to_f16_stochastic(from_bits(0x00000001u), r) == 0x0000u);  // 2^-149: p ~ 2^-125 -> 0 at 32 bits
  }
  // The probability is the dropped fraction: round up iff random < fraction * 2^32.
  const float x = static_cast<float>(1.0 + 0.25 * ulp1);  // fraction 1/4
  REQUIRE(float_to_f16_stochastic(x, 0x3fffffffu) == 0x3c01u);
  REQUIRE(float_to_f16_stochastic(x, 0x40000000u) == 0x3c00u);
  const float s = static_cast<float>(0.75 * sub);  // fraction 3/4 of the smallest subnormal
  REQUIRE(float_to_f16_stochastic(s, 0xbfffffffu) == 0x0001u);
  REQUIRE(float_to_f16_stochastic(s, 0xc0000000u) == 0x0000u);
}
