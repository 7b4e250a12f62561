// kernels/cpu/update_cpu.hpp — the update rules applied over a contiguous float32 range on the host.
#pragma once

#include <cstdint>

#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// All pointers cover `n` elements; `vmax` may be null unless s.amsgrad. `threads` <= 0 uses
// the OpenMP default. Results do not depend on the thread count or on alignment.
void sgd_update_cpu(float* param, const float* grad, float* momentum_buf, int64_t n,
                    const SgdScalars& s, int threads);
void adam_update_cpu(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s, int threads);

}  // namespace kernels
}  // namespace shardopt
