// kernels/cuda/update_kernels.cu — SGD and Adam/AdamW over a flat float32 shard: one grid-stride launch each.
//
// Built with --fmad=false: nvcc would otherwise contract the rules' a*b + c into FMAs, which
// round once instead of twice and would make the GPU disagree with the CPU path (built with
// -ffp-contract=off) in the last bit. sqrtf and '/' are IEEE-rounded by default
// (-prec-sqrt/-prec-div), and denormals are kept (no -ftz), as on the CPU.
#include <cuda_runtime.h>

#include "cuda/cuda_launchers.hpp"

namespace shardopt {
namespace kernels {
namespace {

// One kernel for every rule: the op decides what an item does, the plan which items exist.
template <typename Op>
__global__ void __launch_bounds__(kUpdateThreads) apply_plan_kernel(VectorPlan plan, Op op) {
  run_plan_items(plan, grid_stride_first(blockIdx.x, blockDim.x, threadIdx.x),
                 grid_stride_step(gridDim.x, blockDim.x), op);
}

template <typename Op>
int launch(const VectorPlan& plan, const Op& op, const GridShape& grid, void* stream) {
  if (grid.blocks == 0) return cudaSuccess;
  apply_plan_kernel<Op><<<static_cast<unsigned int>(grid.blocks), grid.threads, 0,
                          static_cast<cudaStream_t>(stream)>>>(plan, op);
  return cudaGetLastError();
}

template <typename Op>
int blocks_per_sm(int* blocks) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, apply_plan_kernel<Op>,
                                                       kUpdateThreads, 0);
}

}  // namespace

int sgd_update_blocks_per_sm(const SgdScalars& s, int* blocks) {
  return s.use_momentum ? blocks_per_sm<SgdItemOp<true>>(blocks)
                        : blocks_per_sm<SgdItemOp<false>>(blocks);
}

int adam_update_blocks_per_sm(const AdamScalars& s, int* blocks) {
  return s.amsgrad ? blocks_per_sm<AdamItemOp<true>>(blocks)
                   : blocks_per_sm<AdamItemOp<false>>(blocks);
}

int launch_sgd_update(const SgdBuffers& buffers, const SgdScalars& s, const VectorPlan& plan,
                      const GridShape& grid, void* stream) {
  if (s.use_momentum) return launch(plan, SgdItemOp<true>{buffers, SgdRule{s}}, grid, stream);
  return launch(plan, SgdItemOp<false>{buffers, SgdRule{s}}, grid, stream);
}

int launch_adam_update(const AdamBuffers& buffers, const AdamScalars& s, const VectorPlan& plan,
                       const GridShape& grid, void* stream) {
  if (s.amsgrad) return launch(plan, AdamItemOp<true>{buffers, AdamRule{s}}, grid, stream);
  return launch(plan, AdamItemOp<false>{buffers, AdamRule{s}}, grid, stream);
}

}  // namespace kernels
}  // namespace shardopt
