// src/optim/device_update.hpp — the CUDA kernels the optimizer launches, callable in every build (Error(unsupported) without CUDA).
//
// Forwards to kernels/cuda when libshardopt has CUDA, so that the optimizer's headers need no
// SHARDOPT_HAVE_CUDA conditionals. Every call only enqueues on `stream` (a cudaStream_t) on
// the calling thread's current device.
#pragma once

#include <cstdint>

#include "mixed_update.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace optim {

// Mixed precision (bf16/f16 parameters with fp32 masters, f32 with a gradient transform);
// the contracts of kernels::sgd_update_cuda / adam_update_cuda.
void sgd_update_device(const kernels::UpdateTensors& t, float* momentum_buf, int64_t n,
                       const kernels::SgdScalars& s, const kernels::GradTransform& gt,
                       const kernels::Rounding& r, void* stream);
void adam_update_device(const kernels::UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                        float* max_exp_avg_sq, int64_t n, const kernels::AdamScalars& s,
                        const kernels::GradTransform& gt, const kernels::Rounding& r,
                        void* stream);
// out[0..1] (device doubles) = sum of squares or max |g| of the unscaled gradients, and the
// inf/NaN flag; see kernels::grad_stats_cuda.
void grad_stats_device(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                       double* out, bool accumulate, void* workspace, void* stream);
// x[i] = narrow(widen(x[i]) / divisor): the average after a summing all-reduce, for any dtype,
// rounded as MPI's host path.
void divide_device(void* x, DType dtype, int64_t n, float divisor, void* stream);

}  // namespace optim
}  // namespace shardopt
