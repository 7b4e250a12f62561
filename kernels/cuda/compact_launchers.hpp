// kernels/cuda/compact_launchers.hpp — internal: the launches of the compact-state kernels (8-bit blockwise Adam moments, bf16 master remainders), compiled by nvcc, called from compact_cuda.cpp.
//
// As cuda_launchers.hpp: each launcher only enqueues its kernel and returns the cudaError_t of
// the launch as int; the checks and the error translation live in compact_cuda.cpp.
#pragma once

#include <cstdint>

#include "mixed_update.hpp"
#include "q8_state.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// What every compact update needs besides its state: the tensors (param, grad, and an fp32
// master or remainders for 16-bit params), the gradient transform and the rounding keys.
struct CompactCommon {
  UpdateTensors t;
  GradTransform gt;
  bool transform = false;    // false: gt is the identity and no multiply happens
  bool stochastic = false;   // bf16/f16 with fp32 masters only
  uint32_t step_key = 0;     // rounding_step_key(seed, step)
  uint64_t first_index = 0;  // rounding index of element 0
  int64_t n = 0;
};

// Adam/AdamW over 8-bit blockwise moments: one CUDA block of kQ8Block threads per block of
// moments (the absmax is the block's reduction), the same per-element operations as
// kernels/cpu/update_q8_cpu.cpp.
int launch_adam_q8(const CompactCommon& c, const Q8Moments& q, const AdamScalars& s, void* stream);

// SGD / Adam with fp32 state over bf16 parameters whose masters are remainders.
int launch_sgd_remainder(const CompactCommon& c, float* momentum_buf, const SgdScalars& s, void* stream);
int launch_adam_remainder(const CompactCommon& c, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                          const AdamScalars& s, void* stream);

}  // namespace kernels
}  // namespace shardopt
