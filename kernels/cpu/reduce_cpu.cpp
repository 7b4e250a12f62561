// kernels/cpu/reduce_cpu.cpp — the average of several ranks' gradient slots in one fixed summation order, compiled once per ISA variant.
//
// Built like update_cpu.cpp (-ffp-contract=off): every variant adds in the same order and
// rounds the same way, so the bits do not depend on the ISA, the thread count or the split.
// Arguments were checked by the public function (dispatch_cpu.cpp).
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/loop_support.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
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

// Where a tree over `count` inputs splits its halves: the largest power of two below the count.
constexpr int largest_power_of_two_below(int count) {
  int split = 1;
  while (split * 2 < count) split *= 2;
  return split;
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
  const int split = largest_power_of_two_below(hi - lo);
  sum_tree<Format>(inputs, lo, lo + split, first, n, out, scratch);
  sum_tree<Format>(inputs, lo + split, hi, first, n, scratch, scratch + kBlock);
  add_block<Format>(out, scratch, n);
}

#if defined(__x86_64__)
// f32 averages stored past the caches. For an output that aliases no input (stage 2's shard
// gradients) a plain store first reads each line it writes, a third more bytes over the memory
// bus for this 2-in-1-out pattern; non-temporal stores skip that read. The same division as
// store_block, so the same bits.
void stream_block_f32(const float* __restrict acc, float* __restrict dst, int64_t n, float divisor) {
#if defined(SHARDOPT_CPU_VARIANT_AVX512)
  constexpr int64_t kLanes = 16;
#elif defined(SHARDOPT_CPU_VARIANT_AVX2)
  constexpr int64_t kLanes = 8;
#else
  constexpr int64_t kLanes = 4;
#endif
  int64_t i = 0;
  // Up to the vector's alignment with plain stores (streaming stores need an aligned address).
  while (i < n && reinterpret_cast<uintptr_t>(dst + i) % (kLanes * sizeof(float)) != 0) {
    dst[i] = acc[i] / divisor;
    ++i;
  }
#if defined(SHARDOPT_CPU_VARIANT_AVX512)
  const __m512 d = _mm512_set1_ps(divisor);
  for (; i + kLanes <= n; i += kLanes) _mm512_stream_ps(dst + i, _mm512_div_ps(_mm512_loadu_ps(acc + i), d));
#elif defined(SHARDOPT_CPU_VARIANT_AVX2)
  const __m256 d = _mm256_set1_ps(divisor);
  for (; i + kLanes <= n; i += kLanes) _mm256_stream_ps(dst + i, _mm256_div_ps(_mm256_loadu_ps(acc + i), d));
#else
  const __m128 d = _mm_set1_ps(divisor);
  for (; i + kLanes <= n; i += kLanes) _mm_stream_ps(dst + i, _mm_div_ps(_mm_loadu_ps(acc + i), d));
#endif
  for (; i < n; ++i) dst[i] = acc[i] / divisor;
}
#endif

// Whether the outputs of an f32 average go out with streaming stores: large ones that alias no
// input. (An output that is also an input was read just before it is written, so its lines are
// in L1 and a plain store costs nothing extra.)
bool streams_outputs(const void* const* inputs, int input_count, void* const* outputs, int output_count, DType dtype,
                     int64_t n) {
#if defined(__x86_64__)
  constexpr int64_t kStreamBytes = 1 << 20;  // below this the output may well be read from cache next
  if (dtype != DType::f32 || n * static_cast<int64_t>(sizeof(float)) < kStreamBytes) return false;
  const auto overlaps = [n](const void* a, const void* b) {
    const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    const uintptr_t bytes = static_cast<uintptr_t>(n) * sizeof(float);
    return x < y + bytes && y < x + bytes;
  };
  for (int j = 0; j < output_count; ++j) {
    for (int i = 0; i < input_count; ++i) {
      if (overlaps(outputs[j], inputs[i])) return false;
    }
  }
  return true;
#else
  (void)inputs, (void)input_count, (void)outputs, (void)output_count, (void)dtype, (void)n;
  return false;
#endif
}

// ---- one pass for up to kFusedInputs inputs -----------------------------------------------------
//
// The same tree, unrolled at compile time per element: every input is read and every output
// written in one loop, with the division done once per element. Measured against the block
// path above (2 inputs, 160 MB each, 2 processes on 2 cores): 0.6x its time with both inputs
// written back (stage 1), 0.8x with one (stage 2). Staging each block's sums in L1 and storing
// them in a second loop costs the difference, though the bytes from memory are the same.
constexpr int kFusedInputs = 8;

// Inputs [Lo, Hi) at element i, summed in sum_tree's order with the same roundings.
template <typename Format, int Lo, int Hi>
float tree_at(const typename Format::Storage* const* in, int64_t i) {
  if constexpr (Hi - Lo == 1) {
    return Format::widen(in[Lo][i]);
  } else {
    constexpr int split = largest_power_of_two_below(Hi - Lo);
    const float low = tree_at<Format, Lo, Lo + split>(in, i);
    const float high = tree_at<Format, Lo + split, Hi>(in, i);
    return Format::widen(Format::narrow(low + high));
  }
}

// Elements [begin, end) of the one-pass loop.
template <typename Format, int Inputs, int Outputs, int... Out>
inline void fused_elements(const typename Format::Storage* const* in, typename Format::Storage* const* out,
                           int64_t begin, int64_t end, float divisor, std::integer_sequence<int, Out...>) {
  using Storage = typename Format::Storage;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const Storage average = Format::narrow(tree_at<Format, 0, Inputs>(in, i) / divisor);
    ((out[Out][i] = average), ...);
  }
}

// Elements [begin, end): the average of `Inputs` inputs into `Outputs` outputs (1, or one per
// input: stage 1's in-place write-back).
template <typename Format, int Inputs, int Outputs, int... Out>
void fused_range(const void* const* inputs, void* const* outputs, int64_t begin, int64_t end, float divisor,
                 std::integer_sequence<int, Out...> outs) {
  using Storage = typename Format::Storage;
  const Storage* in[Inputs];
  for (int k = 0; k < Inputs; ++k) in[k] = static_cast<const Storage*>(inputs[k]);
  Storage* out[Outputs];
  for (int k = 0; k < Outputs; ++k) out[k] = static_cast<Storage*>(outputs[k]);
  // In parts (loop_support.hpp): this 2-in-1-out pattern is bounded by one core's reads.
  walk_in_parts(begin, end, [&](int64_t first, int64_t last) {
    fused_elements<Format, Inputs, Outputs>(in, out, first, last, divisor, outs);
  });
}

template <typename Format, int Inputs>
bool try_fused(const void* const* inputs, void* const* outputs, int output_count, int64_t begin, int64_t end,
               float divisor) {
  if (output_count == 1) {
    fused_range<Format, Inputs, 1>(inputs, outputs, begin, end, divisor, std::make_integer_sequence<int, 1>{});
    return true;
  }
  if (output_count == Inputs) {
    fused_range<Format, Inputs, Inputs>(inputs, outputs, begin, end, divisor,
                                        std::make_integer_sequence<int, Inputs>{});
    return true;
  }
  return false;
}

// The one-pass loop where the input and output counts have one (false: use the block path).
template <typename Format, int... Counts>
bool average_fused(const void* const* inputs, int input_count, void* const* outputs, int output_count, int64_t begin,
                   int64_t end, float divisor, std::integer_sequence<int, Counts...>) {
  bool done = false;
  ((done = done || (input_count == Counts + 1 &&
                    try_fused<Format, Counts + 1>(inputs, outputs, output_count, begin, end, divisor))),
   ...);
  return done;
}

template <typename Format>
void average_range(const void* const* inputs, int input_count, void* const* outputs, int output_count, int64_t begin,
                   int64_t end, float divisor, bool stream) {
  using Storage = typename Format::Storage;
  (void)stream;  // used by the x86 streaming path only
  int levels = 1;
  while ((1 << (levels - 1)) < input_count) ++levels;
  std::vector<float> blocks(static_cast<std::size_t>((levels + 1) * kBlock));
  for (int64_t first = begin; first < end; first += kBlock) {
    const int64_t n = std::min(kBlock, end - first);
    sum_tree<Format>(inputs, 0, input_count, first, n, blocks.data(), blocks.data() + kBlock);
    for (int j = 0; j < output_count; ++j) {
#if defined(__x86_64__)
      if constexpr (std::is_same_v<Format, F32Format>) {
        if (stream) {
          stream_block_f32(blocks.data(), static_cast<float*>(outputs[j]) + first, n, divisor);
          continue;
        }
      }
#endif
      store_block<Format>(blocks.data(), static_cast<Storage*>(outputs[j]) + first, n, divisor);
    }
  }
#if defined(__x86_64__)
  if (stream) _mm_sfence();  // streaming stores are weakly ordered: complete them before the caller signals peers
#endif
}

}  // namespace

void average_slots(const void* const* inputs, int input_count, void* const* outputs, int output_count, DType dtype,
                   int64_t n, float divisor, int threads) {
  const bool stream = streams_outputs(inputs, input_count, outputs, output_count, dtype, n);
  const auto run = [&](auto format) {
    using Format = decltype(format);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) {
      // An output that is not an input takes the block path's streaming stores when `stream`.
      if (!stream && average_fused<Format>(inputs, input_count, outputs, output_count, b, e, divisor,
                                           std::make_integer_sequence<int, kFusedInputs>{})) {
        return;
      }
      average_range<Format>(inputs, input_count, outputs, output_count, b, e, divisor, stream);
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
