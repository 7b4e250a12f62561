// kernels/cuda/update_kernels.cu — SGD and Adam/AdamW over a flat float32 shard: one grid-stride launch each.
//
// Built with --fmad=false: nvcc would otherwise contract the rules' a*b + c into FMAs, which
// round once instead of twice and would make the GPU disagree with the CPU path (built with
// -ffp-contract=off) in the last bit. sqrtf and '/' are IEEE-rounded by default
// (-prec-sqrt/-prec-div), and denormals are kept (no -ftz), as on the CPU.
#include <cuda_runtime.h>

#include "cuda/cuda_launchers.hpp"
#include "cuda/plan_kernel.cuh"

namespace shardopt {
namespace kernels {

int sgd_update_blocks_per_sm(const SgdScalars& s, int* blocks) {
  return s.use_momentum ? plan_blocks_per_sm<SgdItemOp<true>>(blocks)
                        : plan_blocks_per_sm<SgdItemOp<false>>(blocks);
}

int adam_update_blocks_per_sm(const AdamScalars& s, int* blocks) {
  return s.amsgrad ? plan_blocks_per_sm<AdamItemOp<true>>(blocks)
                   : plan_blocks_per_sm<AdamItemOp<false>>(blocks);
}

int launch_sgd_update(const SgdBuffers& buffers, const SgdScalars& s, const VectorPlan& plan,
                      const GridShape& grid, void* stream) {
  if (s.use_momentum) return launch_plan(plan, SgdItemOp<true>{buffers, SgdRule{s}}, grid, stream);
  return launch_plan(plan, SgdItemOp<false>{buffers, SgdRule{s}}, grid, stream);
}

int launch_adam_update(const AdamBuffers& buffers, const AdamScalars& s, const VectorPlan& plan,
                       const GridShape& grid, void* stream) {
  if (s.amsgrad) return launch_plan(plan, AdamItemOp<true>{buffers, AdamRule{s}}, grid, stream);
  return launch_plan(plan, AdamItemOp<false>{buffers, AdamRule{s}}, grid, stream);
}

}  // namespace kernels
}  // namespace shardopt
