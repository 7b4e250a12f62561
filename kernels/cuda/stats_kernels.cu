// kernels/cuda/stats_kernels.cu — gradient statistics (sum of squares or max |g| after unscaling, and the inf/NaN flag) in the fixed order of grad_stats.hpp.
//
// A warp reduces one 4096-element chunk (its 32 lanes are the order's 32 lanes, and the
// shuffle-down tree is its halving tree); a block owns one group of consecutive chunks and
// adds their sums in order on one thread; a single block then adds the group partials in
// order. The order depends on n only, so the result is the same bits as grad_stats_cpu on any
// device. Built with --fmad=false (d*d + acc must not become an FMA; the product is exact
// anyway, but the rule is simpler to keep than to argue).
#include <cuda_runtime.h>

#include "cuda/cuda_launchers.hpp"
#include "grad_stats.hpp"
#include "mixed_update.hpp"

namespace shardopt {
namespace kernels {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = kReduceThreads / kWarpSize;
static_assert(kStatsLanes == kWarpSize, "a warp reduces one chunk");

template <typename Format, bool kInfNorm>
__global__ void __launch_bounds__(kReduceThreads)
    grad_stats_groups_kernel(const typename Format::Storage* x, int64_t n, float unscale,
                             StatsShape shape, double* partials) {
  __shared__ double chunk_values[kWarps];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * shape.chunks_per_group;
  const int64_t last = min(first + shape.chunks_per_group, shape.chunks);
  double group = 0.0;  // meaningful on thread 0 only
  uint32_t nonfinite = 0u;
  for (int64_t base = first; base < last; base += kWarps) {
    const int64_t chunk = base + warp;
    if (chunk < last) {  // uniform across the warp
      const int64_t begin = chunk * kStatsChunk;
      const int64_t len = min(kStatsChunk, n - begin);
      double acc = 0.0;
#pragma unroll 4
      for (int64_t k = lane; k < len; k += kWarpSize) {
        const float g = Format::widen(x[begin + k]) * unscale;
        nonfinite |= nonfinite_bit(g);
        acc = stats_combine<kInfNorm>(acc, stats_term<kInfNorm>(g));
      }
      for (int width = kWarpSize / 2; width >= 1; width /= 2) {
        const double other = __shfl_down_sync(0xffffffffu, acc, width);
        if (lane < width) acc = stats_combine<kInfNorm>(acc, other);
      }
      if (lane == 0) chunk_values[warp] = acc;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarps && base + w < last; ++w) {
        group = stats_combine<kInfNorm>(group, chunk_values[w]);
      }
    }
    __syncthreads();
  }
  const int any = __syncthreads_or(nonfinite != 0u);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = group;
    partials[2 * blockIdx.x + 1] = any ? 1.0 : 0.0;
  }
}

// The group partials in order: staged in shared memory by the whole block, added by thread 0.
template <bool kInfNorm>
__global__ void __launch_bounds__(kReduceThreads)
    grad_stats_final_kernel(const double* partials, int groups, double* out, bool accumulate) {
  __shared__ double values[kStatsMaxGroups];
  __shared__ double flags[kStatsMaxGroups];
  for (int g = static_cast<int>(threadIdx.x); g < groups; g += kReduceThreads) {
    values[g] = partials[2 * g];
    flags[g] = partials[2 * g + 1];
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  double total = 0.0;
  double nonfinite = 0.0;
  for (int g = 0; g < groups; ++g) {
    total = stats_combine<kInfNorm>(total, values[g]);
    nonfinite = flags[g] != 0.0 ? 1.0 : nonfinite;
  }
  if (accumulate) {
    out[0] = stats_combine<kInfNorm>(out[0], total);
    out[1] = out[1] != 0.0 || nonfinite != 0.0 ? 1.0 : 0.0;
  } else {
    out[0] = total;
    out[1] = nonfinite;
  }
}

template <typename Format, bool kInfNorm>
int launch_stats(const void* grad, int64_t n, float unscale, double* partials, double* out,
                 bool accumulate, cudaStream_t stream) {
  const StatsShape shape = stats_shape(n);
  if (shape.groups > 0) {
    grad_stats_groups_kernel<Format, kInfNorm>
        <<<static_cast<unsigned int>(shape.groups), kReduceThreads, 0, stream>>>(
            static_cast<const typename Format::Storage*>(grad), n, unscale, shape, partials);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  grad_stats_final_kernel<kInfNorm><<<1, kReduceThreads, 0, stream>>>(
      partials, static_cast<int>(shape.groups), out, accumulate);
  return cudaGetLastError();
}

template <typename Format>
int launch_stats_for(bool inf_norm, const void* grad, int64_t n, float unscale, double* partials,
                     double* out, bool accumulate, cudaStream_t stream) {
  return inf_norm ? launch_stats<Format, true>(grad, n, unscale, partials, out, accumulate, stream)
                  : launch_stats<Format, false>(grad, n, unscale, partials, out, accumulate, stream);
}

}  // namespace

int launch_grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                      double* partials, double* out, bool accumulate, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DType::f32:
      return launch_stats_for<F32Format>(inf_norm, grad, n, unscale, partials, out, accumulate, s);
    case DType::bf16:
      return launch_stats_for<Bf16Format>(inf_norm, grad, n, unscale, partials, out, accumulate, s);
    case DType::f16:
      return launch_stats_for<F16Format>(inf_norm, grad, n, unscale, partials, out, accumulate, s);
    case DType::byte: break;  // raw bytes are not gradients
  }
  return cudaErrorInvalidValue;
}

}  // namespace kernels
}  // namespace shardopt
