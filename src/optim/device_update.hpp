// src/optim/device_update.hpp — the CUDA kernels the optimizer launches, callable in every build (Error(unsupported) without CUDA).
//
// Forwards to kernels/cuda when libshardopt has CUDA, so that the optimizer's headers need no
// SHARDOPT_HAVE_CUDA conditionals. Every call only enqueues on `stream` (a cudaStream_t) on
// the calling thread's current device.
#pragma once

#include <cstdint>

#include "update_rules.hpp"

namespace shardopt {
namespace optim {

void sgd_update_device(float* param, const float* grad, float* momentum_buf, int64_t n,
                       const kernels::SgdScalars& s, void* stream);
void adam_update_device(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                        float* max_exp_avg_sq, int64_t n, const kernels::AdamScalars& s,
                        void* stream);
// x[i] = x[i] / divisor: the average after a summing all-reduce, rounded as MPI's host path.
void divide_device(float* x, int64_t n, float divisor, void* stream);

}  // namespace optim
}  // namespace shardopt
