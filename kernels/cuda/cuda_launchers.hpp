// kernels/cuda/cuda_launchers.hpp — internal: the kernel launches compiled by nvcc, called from update_cuda.cpp.
//
// The split keeps exceptions, fmt and argument checking out of the nvcc translation units:
// each launcher only enqueues its kernel(s) and returns the cudaError_t of the launch as int.
#pragma once

#include <cstdint>

#include "cuda/launch_plan.hpp"
#include "cuda/update_items.hpp"

namespace shardopt {
namespace kernels {

constexpr int kUpdateThreads = 256;  // threads per block of the update kernels
constexpr int kReduceThreads = 256;  // threads per block of the reductions
// Partials the squared norm writes (one per block); fixed, so its summation order is too.
constexpr int64_t kReduceMaxBlocks = 1024;

// Blocks of each kernel that are resident on one SM at once (the occupancy calculator), so the
// grid can be sized to exactly one wave: with a grid-stride loop, a partial second wave would
// leave most SMs idle while it runs. Each returns a cudaError_t as int.
int sgd_update_blocks_per_sm(const SgdScalars& s, int* blocks);
int adam_update_blocks_per_sm(const AdamScalars& s, int* blocks);
int any_nonfinite_blocks_per_sm(int* blocks);
int divide_blocks_per_sm(int* blocks);

int launch_sgd_update(const SgdBuffers& buffers, const SgdScalars& s, const VectorPlan& plan,
                      const GridShape& grid, void* stream);
int launch_adam_update(const AdamBuffers& buffers, const AdamScalars& s, const VectorPlan& plan,
                       const GridShape& grid, void* stream);

// Block partials into `partials` (grid.blocks of them), then one block sums them into *out.
// With grid.blocks == 0 (n == 0) only the second kernel runs: *out = 0 (or stays, accumulating).
int launch_squared_norm(const float* x, const VectorPlan& plan, const GridShape& grid,
                        float* partials, float* out, bool accumulate, void* stream);
int launch_any_nonfinite(const float* x, const VectorPlan& plan, const GridShape& grid,
                         int32_t* found, void* stream);
int launch_divide(float* x, float divisor, const VectorPlan& plan, const GridShape& grid,
                  void* stream);

}  // namespace kernels
}  // namespace shardopt
