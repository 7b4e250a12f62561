// kernels/cuda/scale_kernels.cu — x[i] = x[i] / divisor over a float buffer: the average after a summing all-reduce.
//
// '/' is IEEE-rounded (nvcc's default -prec-div=true), so the result is bitwise what
// MpiCommunicator's host loop computes for ReduceOp::avg.
#include <cuda_runtime.h>

#include "cuda/cuda_launchers.hpp"

namespace shardopt {
namespace kernels {
namespace {

struct DivideOp {
  float* x;
  float divisor;
  __device__ void operator()(const PlanItem& item) const {
    if (item.width == kVectorWidth) {
      Float4 v = load_float4(x + item.first);
      for (int l = 0; l < kVectorWidth; ++l) v.lane[l] = v.lane[l] / divisor;
      store_float4(x + item.first, v);
    } else {
      x[item.first] = x[item.first] / divisor;
    }
  }
};

__global__ void __launch_bounds__(kUpdateThreads) divide_kernel(VectorPlan plan, DivideOp op) {
  run_plan_items(plan, grid_stride_first(blockIdx.x, blockDim.x, threadIdx.x),
                 grid_stride_step(gridDim.x, blockDim.x), op);
}

}  // namespace

int divide_blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, divide_kernel, kUpdateThreads, 0);
}

int launch_divide(float* x, float divisor, const VectorPlan& plan, const GridShape& grid,
                  void* stream) {
  if (grid.blocks == 0) return cudaSuccess;
  divide_kernel<<<static_cast<unsigned int>(grid.blocks), grid.threads, 0,
                  static_cast<cudaStream_t>(stream)>>>(plan, DivideOp{x, divisor});
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace shardopt
