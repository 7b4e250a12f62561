// kernels/cpu/update_cpu.hpp — the update rules, gradient statistics and dtype conversions over contiguous host ranges.
#pragma once

#include <cstdint>

#include "mixed_update.hpp"
#include "q8_state.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// All pointers cover `n` elements; `vmax` (max_exp_avg_sq) may be null unless s.amsgrad, the
// momentum buffer unless s.use_momentum. `threads` <= 0 uses the OpenMP default. Results do
// not depend on the thread count, on alignment or on how a range is split into calls (with
// Rounding::first_index advanced by the split offset). For n > 0, a null buffer that is used,
// an unknown dtype, or a master that is given for f32 / missing for bf16/f16 raises
// shardopt::Error(invalid_argument); so do the functions below for null buffers and dtypes.
// Every function here runs the ISA variant chosen at the first call (kernels/cpu/cpu_isa.hpp;
// Error(unsupported) when SHARDOPT_CPU_ISA names one this CPU lacks); all variants give the
// same bits.
void sgd_update_cpu(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                    const GradTransform& gt, const Rounding& r, int threads);
void adam_update_cpu(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s,
                     const GradTransform& gt, const Rounding& r, int threads);

// Adam/AdamW with 8-bit blockwise moments (kernels/q8_state.hpp): `n` elements of one parameter
// from one of its block boundaries (only the parameter's last block may be partial), `q` their
// codes and q8_blocks(n) absmax values each. Per block: dequantise, the rule of adam_update_cpu,
// the new absmax, quantise. No amsgrad (max_exp_avg_sq has no 8-bit form): Error(invalid_argument).
void adam_update_q8_cpu(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                        const GradTransform& gt, const Rounding& r, int threads);

// The float32 forms: the calls above with dtype f32, no transform.
void sgd_update_cpu(float* param, const float* grad, float* momentum_buf, int64_t n,
                    const SgdScalars& s, int threads);
void adam_update_cpu(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                     float* max_exp_avg_sq, int64_t n, const AdamScalars& s, int threads);

// value: sum of squares (inf_norm=false) or max |g| (inf_norm=true); nonfinite: any inf/NaN.
struct GradStats {
  double value = 0.0;
  bool nonfinite = false;
};

// The fixed summation order of grad_stats (CPU and CUDA alike; see kernels/grad_stats.hpp):
// 4096-element chunks, each summed in 32 interleaved lanes combined by a halving tree; chunk
// sums added in order within groups of consecutive chunks, group sums in order. It depends on
// n only, never on the thread count or device.
//
// Over n gradients of dtype, each first unscaled in float (g * unscale, rounded to float), then
// squared exactly in double and summed in double. NaNs do not take part in the max (they are
// reported through `nonfinite`). nonfinite: any element, after unscaling, is inf or NaN.
GradStats grad_stats_cpu(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                         int threads);

// dst = the exact float of src.
void widen_cpu(const void* src, DType dtype, float* dst, int64_t n, int threads);
// dst = src rounded to nearest-even (f32: a copy).
void narrow_cpu(const float* src, void* dst, DType dtype, int64_t n, int threads);
// x[i] = narrow(widen(x[i]) / divisor) with nearest-even: the average after a summing
// reduction, for any dtype.
void divide_cpu(void* x, DType dtype, int64_t n, float divisor, int threads);
// The average of `input_count` ranks' gradients: element i of every output is
// narrow(sum / divisor), where sum adds element i of the inputs in a fixed binary tree (halves
// split at the largest power of two below the count, the lower half first: the order of a
// binomial reduce to rank 0), each pairwise addition done in float and rounded to the dtype
// (as the MPI backend's reductions). Each buffer covers n elements; outputs may be inputs
// (each element is read before it is written). Over 64 inputs are refused.
void average_slots_cpu(const void* const* inputs, int input_count, void* const* outputs, int output_count,
                       DType dtype, int64_t n, float divisor, int threads);

}  // namespace kernels
}  // namespace shardopt
