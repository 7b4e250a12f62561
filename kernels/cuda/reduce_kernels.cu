// kernels/cuda/reduce_kernels.cu — CUB block reductions: squared L2 norm and the inf/NaN check of a float buffer.
//
// Both read through the same launch plan as the updates (16-byte loads over the aligned body).
// The norm is two-pass instead of atomics so that its result is reproducible bit for bit:
// every block writes its partial, then a single block adds the partials in a fixed tree.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "cuda/cuda_launchers.hpp"

namespace shardopt {
namespace kernels {
namespace {

// An IEEE float is inf or NaN exactly when its exponent bits are all ones; testing the bits
// keeps the check valid even if someone builds this file with fast-math flags.
__device__ __forceinline__ int is_nonfinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

struct SquareSum {
  const float* x;
  float* acc;
  __device__ void operator()(const PlanItem& item) const {
    if (item.width == kVectorWidth) {
      const Float4 v = load_float4(x + item.first);
      for (int l = 0; l < kVectorWidth; ++l) *acc += v.lane[l] * v.lane[l];
    } else {
      const float v = x[item.first];
      *acc += v * v;
    }
  }
};

struct NonfiniteAny {
  const float* x;
  int* any;
  __device__ void operator()(const PlanItem& item) const {
    if (item.width == kVectorWidth) {
      const Float4 v = load_float4(x + item.first);
      for (int l = 0; l < kVectorWidth; ++l) *any |= is_nonfinite(v.lane[l]);
    } else {
      *any |= is_nonfinite(x[item.first]);
    }
  }
};

__global__ void __launch_bounds__(kReduceThreads)
    squared_norm_partials_kernel(const float* x, VectorPlan plan, float* partials) {
  using BlockReduce = cub::BlockReduce<float, kReduceThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  float acc = 0.f;
  run_plan_items(plan, grid_stride_first(blockIdx.x, blockDim.x, threadIdx.x),
                 grid_stride_step(gridDim.x, blockDim.x), SquareSum{x, &acc});
  const float block_sum = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

__global__ void __launch_bounds__(kReduceThreads)
    sum_partials_kernel(const float* partials, int count, float* out, bool accumulate) {
  using BlockReduce = cub::BlockReduce<float, kReduceThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  float acc = 0.f;
  for (int i = static_cast<int>(threadIdx.x); i < count; i += kReduceThreads) acc += partials[i];
  const float total = BlockReduce(temp).Sum(acc);
  if (threadIdx.x == 0) *out = accumulate ? *out + total : total;
}

__global__ void __launch_bounds__(kReduceThreads)
    any_nonfinite_kernel(const float* x, VectorPlan plan, int32_t* found) {
  using BlockReduce = cub::BlockReduce<int, kReduceThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  int any = 0;
  run_plan_items(plan, grid_stride_first(blockIdx.x, blockDim.x, threadIdx.x),
                 grid_stride_step(gridDim.x, blockDim.x), NonfiniteAny{x, &any});
  const int block_count = BlockReduce(temp).Sum(any);
  // Only ever writes 1, so blocks racing on the flag all store the same value.
  if (threadIdx.x == 0 && block_count > 0) *found = 1;
}

}  // namespace

int any_nonfinite_blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, any_nonfinite_kernel,
                                                       kReduceThreads, 0);
}

int launch_squared_norm(const float* x, const VectorPlan& plan, const GridShape& grid,
                        float* partials, float* out, bool accumulate, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (grid.blocks > 0) {
    squared_norm_partials_kernel<<<static_cast<unsigned int>(grid.blocks), kReduceThreads, 0, s>>>(
        x, plan, partials);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  sum_partials_kernel<<<1, kReduceThreads, 0, s>>>(partials, static_cast<int>(grid.blocks), out,
                                                   accumulate);
  return cudaGetLastError();
}

int launch_any_nonfinite(const float* x, const VectorPlan& plan, const GridShape& grid,
                         int32_t* found, void* stream) {
  if (grid.blocks == 0) return cudaSuccess;
  any_nonfinite_kernel<<<static_cast<unsigned int>(grid.blocks), kReduceThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(x, plan, found);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace shardopt
