// kernels/cuda/plan_kernel.cuh — the one grid-stride kernel every plan-based op runs, with its launch and occupancy query (nvcc only).
#pragma once

#include <cuda_runtime.h>

#include "cuda/cuda_launchers.hpp"

namespace shardopt {
namespace kernels {
namespace {

// One kernel for every op: the op decides what an item does, the plan which items exist.
template <typename Op>
__global__ void __launch_bounds__(kUpdateThreads) apply_plan_kernel(VectorPlan plan, Op op) {
  run_plan_items(plan, grid_stride_first(blockIdx.x, blockDim.x, threadIdx.x),
                 grid_stride_step(gridDim.x, blockDim.x), op);
}

template <typename Op>
int launch_plan(const VectorPlan& plan, const Op& op, const GridShape& grid, void* stream) {
  if (grid.blocks == 0) return cudaSuccess;
  apply_plan_kernel<Op><<<static_cast<unsigned int>(grid.blocks), grid.threads, 0,
                          static_cast<cudaStream_t>(stream)>>>(plan, op);
  return cudaGetLastError();
}

template <typename Op>
int plan_blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, apply_plan_kernel<Op>,
                                                       kUpdateThreads, 0);
}

}  // namespace
}  // namespace kernels
}  // namespace shardopt
