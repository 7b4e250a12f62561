// src/comm/mpi/half_reduce.hpp — element-wise bf16/f16 sum, max and average on raw 16-bit words, for MPI's user-defined reductions.
//
// MPI has no 16-bit float types, so bf16 and f16 buffers travel as MPI_UINT16_T and these
// functions give the words their meaning: widen both operands to float, combine in float, and
// narrow back with round-to-nearest-even (numerics/half_float.hpp, the conversions the kernels use).
//
// One float addition of two bf16 or f16 values followed by the rounding to the dtype gives the
// correctly rounded sum of the two: a float has at least 2p+2 significand bits for p = 8 (bf16)
// and p = 11 (f16), so the intermediate rounding to float never changes the final result.
#pragma once

#include <cstdint>

#include "numerics/half_float.hpp"

namespace shardopt {
namespace comm {

struct Bf16Words {
  static float widen(uint16_t h) { return numerics::bf16_to_float(h); }
  static uint16_t narrow(float f) { return numerics::float_to_bf16(f); }
};

struct F16Words {
  static float widen(uint16_t h) { return numerics::f16_to_float(h); }
  static uint16_t narrow(float f) { return numerics::float_to_f16(f); }
};

// The sum of a and b, rounded to the dtype.
template <typename Words>
inline uint16_t sum_words(uint16_t a, uint16_t b) {
  return Words::narrow(Words::widen(a) + Words::widen(b));
}

// The larger of a and b, independent of the operands' order (so of MPI's reduction order):
// NaN wins over numbers (the smaller word of two NaNs), and +0 over -0.
template <typename Words>
inline uint16_t max_words(uint16_t a, uint16_t b) {
  const float x = Words::widen(a);
  const float y = Words::widen(b);
  const bool x_nan = x != x;
  const bool y_nan = y != y;
  if (x_nan || y_nan) {
    if (x_nan && y_nan) return a < b ? a : b;
    return x_nan ? a : b;
  }
  if (x > y) return a;
  if (y > x) return b;
  return (a & 0x8000u) != 0 ? b : a;  // equal values: identical words, or -0 and +0
}

// A sum divided by the number of ranks in float, rounded to the dtype.
template <typename Words>
inline uint16_t average_word(uint16_t sum, float ranks) {
  return Words::narrow(Words::widen(sum) / ranks);
}

}  // namespace comm
}  // namespace shardopt
