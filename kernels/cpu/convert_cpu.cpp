// kernels/cpu/convert_cpu.cpp — dtype conversions (widen, narrow, divide) and gradient statistics over host ranges, split across OpenMP threads; compiled once per ISA variant.
//
// Built like update_cpu.cpp (-ffp-contract=off, -fno-math-errno): the conversions are integer
// code and the statistics follow the fixed order of kernels/grad_stats.hpp, so the results do
// not depend on the thread count, the ISA variant or the split. Arguments were checked by the
// public functions (dispatch_cpu.cpp).
#include "cpu/cpu_variant.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/loop_support.hpp"
#include "grad_stats.hpp"
#include "precision.hpp"

SHARDOPT_CPU_VARIANT_BEGIN
namespace {

using namespace cpu_loops;

// ---- conversions -----------------------------------------------------------------------------------

template <typename F>
void with_format(DType dtype, const F& f) {
  switch (dtype) {
    case DType::f32: f(F32Format{}); break;
    case DType::bf16: f(Bf16Format{}); break;
    case DType::f16: f(F16Format{}); break;
    case DType::byte: break;  // raw bytes have no element format; the public functions refuse them
  }
}

template <typename Format>
void widen_loop(const typename Format::Storage* __restrict src, float* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Format::widen(src[i]);
}

template <typename Format>
void narrow_loop(const float* __restrict src, typename Format::Storage* __restrict dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = Format::narrow(src[i]);
}

template <typename Format>
void divide_loop(typename Format::Storage* __restrict x, int64_t n, float divisor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = Format::narrow(Format::widen(x[i]) / divisor);
}

// ---- gradient statistics ------------------------------------------------------------------------------

template <typename Format, bool kInfNorm>
GradStats grad_stats_typed(const typename Format::Storage* x, int64_t n, float unscale, int threads) {
  const StatsShape shape = stats_shape(n);
  std::vector<double> chunk_values(static_cast<std::size_t>(shape.chunks));
  uint32_t nonfinite = 0u;
  const int team = team_size(n, threads);
  (void)team;  // unused without OpenMP
#pragma omp parallel for schedule(static) num_threads(team) reduction(| : nonfinite) if (team > 1)
  for (int64_t c = 0; c < shape.chunks; ++c) {
    const int64_t first = c * kStatsChunk;
    const int64_t len = std::min<int64_t>(kStatsChunk, n - first);
    chunk_values[static_cast<std::size_t>(c)] =
        stats_chunk<Format, kInfNorm>(x + first, len, unscale, &nonfinite);
  }
  // The fixed order of kernels/grad_stats.hpp: chunk sums in order within each group, then
  // the group sums in order.
  double total = 0.0;
  for (int64_t group = 0; group < shape.groups; ++group) {
    const int64_t begin = group * shape.chunks_per_group;
    const int64_t end = std::min(shape.chunks, begin + shape.chunks_per_group);
    double sum = 0.0;
    for (int64_t c = begin; c < end; ++c) {
      sum = stats_combine<kInfNorm>(sum, chunk_values[static_cast<std::size_t>(c)]);
    }
    total = stats_combine<kInfNorm>(total, sum);
  }
  return GradStats{stats_result(total), nonfinite != 0u};
}

}  // namespace

GradStats grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm, int threads) {
  GradStats stats;
  with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    const auto* x = static_cast<const typename Format::Storage*>(grad);
    stats = inf_norm ? grad_stats_typed<Format, true>(x, n, unscale, threads)
                     : grad_stats_typed<Format, false>(x, n, unscale, threads);
  });
  return stats;
}

void widen(const void* src, DType dtype, float* dst, int64_t n, int threads) {
  with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    const auto* in = static_cast<const typename Format::Storage*>(src);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) { widen_loop<Format>(in + b, dst + b, e - b); });
  });
}

void narrow(const float* src, void* dst, DType dtype, int64_t n, int threads) {
  with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    auto* out = static_cast<typename Format::Storage*>(dst);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) { narrow_loop<Format>(src + b, out + b, e - b); });
  });
}

void divide(void* x, DType dtype, int64_t n, float divisor, int threads) {
  with_format(dtype, [&](auto format) {
    using Format = decltype(format);
    auto* data = static_cast<typename Format::Storage*>(x);
    parallel_ranges(n, threads, [&](int64_t b, int64_t e) { divide_loop<Format>(data + b, e - b, divisor); });
  });
}

SHARDOPT_CPU_VARIANT_END
