// kernels/cuda/muon_launchers.hpp — internal: the element-wise kernels of Muon on CUDA (muon_kernels.cu), called from muon_cuda.cpp; each enqueues and returns the launch's cudaError_t as int.
#pragma once

#include <cstdint>

#include "mixed_update.hpp"
#include "shardopt/types.hpp"

namespace shardopt {
namespace kernels {

// update[i] = the Muon blend of grad[i] (widened, transformed) and momentum[i] (updated in place).
int launch_muon_momentum(const void* grad, DType dtype, float* momentum, float* update, int64_t n,
                         GradTransform gt, float momentum_weight, float one_minus_momentum, bool nesterov,
                         void* stream);
// out = in (rows x cols, row-major) or its transpose (cols x rows), each value rounded to bf16
// where `round_bf16`. in and out must not alias.
int launch_muon_copy(const float* in, float* out, int64_t rows, int64_t cols, bool transpose, bool round_bf16,
                     void* stream);
// *squares = the sum of x[i]^2 in double, in a fixed order (one block).
int launch_muon_sum_squares(const float* x, int64_t n, double* squares, void* stream);
// x[i] /= max(norm, floor), norm = float(sqrt(*squares)) (rounded to bf16 where `round_bf16`,
// and then each quotient too); `floor` is eps as the CPU kernel rounds it.
int launch_muon_normalize(float* x, int64_t n, const double* squares, float floor, bool round_bf16, void* stream);
// out = beta * c + alpha * product (out = product without c), rounded to bf16 where asked.
int launch_muon_epilogue(const float* c, float beta, const float* product, float alpha, int64_t n, float* out,
                         bool round_bf16, void* stream);
// out[i] = in[i] as bf16 bits (exact for the bf16-rounded values the bf16 path keeps): the
// operands of the bf16 products.
int launch_muon_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream);
// The m x m matrix `a` with only its upper triangle (column-major, as ssyrk wrote it) made
// exactly symmetric.
int launch_muon_mirror(float* a, int64_t m, void* stream);
// values = values * decay + neg_lr * update (param for f32, the master otherwise), then the
// bf16/f16 param from the master (stochastic: keyed by step_key and first_index + i).
int launch_muon_apply(void* param, float* master, DType dtype, const float* update, int64_t n, float decay,
                      float neg_lr, bool stochastic, uint32_t step_key, uint64_t first_index, void* stream);

}  // namespace kernels
}  // namespace shardopt
