// kernels/cpu/reduce_cpu.cpp — the average of several ranks' gradient slots in one fixed summation order, compiled once per ISA variant.
//
// Built like update_cpu.cpp (-ffp-contract=off): every variant adds in the same order and
// rounds the same way, so the bits do not depend on the ISA, the thread count or the split.
// Arguments were checked by the public function (dispatch_cpu.cpp).
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/loop_support.hpp"
#include "precision.hpp"

SHARDOPT_CPU_VARIANT_BEGIN
namespace {

using namespace cpu_loops;

// Elements summed at a time: the partial sums of one block stay in the L1 cache, so each
// input is read from memory once and each output written once.
constexpr int64_t kBlock = 1024;

template <typename Format>
void load_block(const typename Format::Storage* __restrict src, float* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Format::widen(src[i]);
}

// One pairwise combination, in float and rounded to the dtype (as the MPI backend's 16-bit
// reduction operations; f32 rounds in the addition itself).
template <typename Format>
void add_block(float* __restrict acc, const float* __restrict other, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] = Format::widen(Format::narrow(acc[i] + other[i]));
}

// The first pairwise sum straight from two inputs (saves a pass over the block).
template <typename Format>
void add_pair(const typename Format::Storage* __restrict a, const typename Format::Storage* __restrict b,
              float* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = Format::widen(Format::narrow(Format::widen(a[i]) + Format::widen(b[i])));
}

template <typename Format>
void store_block(const float* __restrict acc, typename Format::Storage* __restrict dst, int64_t n, float divisor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Format::narrow(acc[i] / divisor);
}

// Inputs [lo, hi) summed into `out` over elements [first, first + n): the two halves split at
// the largest power of two below the count, each summed the same way, then added (lower half
// first): the order of a binomial-tree reduce to rank 0. `scratch` holds a block per level.
template <typename Format>
void sum_tree(const void* const* inputs, int lo, int hi, int64_t first, int64_t n, float* out, float* scratch) {
  using Storage = typename Format::Storage;
  if (hi - lo == 1) {
    load_block<Format>(static_cast<const Storage*>(inputs[lo]) + first, out, n);
    return;
  }
  if (hi - lo == 2) {
    add_pair<Format>(static_cast<const Storage*>(inputs[lo]) + first, static_cast<const Storage*>(inputs[lo + 1]) + first,
                     out, n);
    return;
  }
  int split = 1;
  while (split * 2 < hi - lo) split *= 2;
  sum_tree<Format>(inputs, lo, lo + split, first, n, out, scratch);
  sum_tree<Format>(inputs, lo + split, hi, first, n, scratch, scratch + kBlock);
  add_block<Format>(out, scratch, n);
}

template <typename Format>
void average_range(const void* const* inputs, int input_count, void* const* outputs, int output_count, int64_t begin,
                   int64_t end, float divisor) {
  using Storage = typename Format::Storage;
  int levels = 1;
  while ((1 << (levels - 1)) < input_count) ++levels;
  std::vector<float> blocks(static_cast<std::size_t>((levels + 1) * kBlock));
  for (int64_t first = begin; first < end; first += kBlock) {
    const int64_t n = std::min(kBlock, end - first);
    sum_tree<Format>(inputs, 0, input_count, first, n, blocks.data(), blocks.data() + kBlock);
    for (int j = 0; j < output_count; ++j) {
      store_block<Format>(blocks.data(), static_cast<Storage*>(outputs[j]) + first, n, divisor);
    }
  }
}

}  // namespace

void average_slots(const void* const* inputs, int input_count, void* const* outputs, int output_count, DType dtype,
                   int64_t n, float divisor, int threads) {
  const auto run = [&](auto format) {
    using Format = decltype(format);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
      average_range<Format>(inputs, input_count, outputs, output_count, b, e, divisor);
    });
  };
  switch (dtype) {
    case DType::f32: run(F32Format{}); break;
    case DType::bf16: run(Bf16Format{}); break;
    case DType::f16: run(F16Format{}); break;
    case DType::byte: break;  // refused by the public function
  }
}

SHARDOPT_CPU_VARIANT_END
