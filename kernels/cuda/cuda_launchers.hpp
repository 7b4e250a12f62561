// kernels/cuda/cuda_launchers.hpp — internal: the kernel launches compiled by nvcc, called from update_cuda.cpp.
//
// The split keeps exceptions, fmt and argument checking out of the nvcc translation units:
// each launcher only enqueues its kernel(s) and returns the cudaError_t of the launch as int.
#pragma once

#include <cstdint>

#include "cuda/launch_plan.hpp"
#include "cuda/mixed_items.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace kernels {

constexpr int kUpdateThreads = 256;  // threads per block of the update and conversion kernels
constexpr int kReduceThreads = 256;  // threads per block of the gradient statistics

// ---- updates and conversions (mixed_kernels.cu), gradient statistics (stats_kernels.cu) ---------
//
// The *_blocks_per_sm queries give the blocks of a kernel that are resident on one SM at once
// (the occupancy calculator), so the grid can be sized to exactly one wave: with a grid-stride
// loop, a partial second wave would leave most SMs idle while it runs. Each returns a
// cudaError_t as int.

// One update launch (any dtype: f32 runs F32Format): the dtype and rounding mode pick the
// kernel; unused state pointers are null.
struct MixedSgdArgs {
  MixedCommon common;
  DType dtype = DType::f32;
  bool stochastic = false;
  float* momentum_buf = nullptr;
  SgdScalars s;
};
struct MixedAdamArgs {
  MixedCommon common;
  DType dtype = DType::f32;
  bool stochastic = false;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
  AdamScalars s;
};

int mixed_sgd_blocks_per_sm(const MixedSgdArgs& args, int* blocks);
int mixed_adam_blocks_per_sm(const MixedAdamArgs& args, int* blocks);
int launch_mixed_sgd(const MixedSgdArgs& args, const VectorPlan& plan, const GridShape& grid,
                     void* stream);
int launch_mixed_adam(const MixedAdamArgs& args, const VectorPlan& plan, const GridShape& grid,
                      void* stream);

enum class ConvertKind { widen, narrow, divide };
int convert_blocks_per_sm(ConvertKind kind, DType dtype, int* blocks);
int launch_widen(const void* src, DType dtype, float* dst, const VectorPlan& plan,
                 const GridShape& grid, void* stream);
int launch_narrow(const float* src, void* dst, DType dtype, const VectorPlan& plan,
                  const GridShape& grid, void* stream);
int launch_divide(void* x, DType dtype, float divisor, const VectorPlan& plan,
                  const GridShape& grid, void* stream);

// Group partials (2 doubles per group of stats_shape(n): value, nonfinite flag) into
// `partials`, then one block combines them in order into out[0..1]. With n == 0 only the
// second kernel runs: out = {0, 0}, or unchanged when accumulating.
int launch_grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                      double* partials, double* out, bool accumulate, void* stream);

}  // namespace kernels
}  // namespace shardopt
