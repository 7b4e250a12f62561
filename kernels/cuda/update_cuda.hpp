// kernels/cuda/update_cuda.hpp — the CUDA update rules, gradient statistics and dtype conversions, callable from plain C++ (streams are opaque).
//
// Nothing here needs cuda_runtime.h: a stream is passed as `void*` holding a cudaStream_t
// (null means the legacy default stream). Every function only enqueues work on that stream
// and returns; failures to launch raise shardopt::Error(cuda), bad arguments
// Error(invalid_argument). All pointers are device (or managed) memory on the current device.
// Only available when the library was built with CUDA (SHARDOPT_HAVE_CUDA).
//
// `cache` (last argument, may be null): launch parameters kept across calls by their owner
// (launch_cache.hpp), all on one device; with it, a launch makes no runtime query once its
// kernel's slot is filled.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/launch_cache.hpp"
#include "mixed_update.hpp"
#include "q8_state.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// The contract of sgd_update_cpu / adam_update_cpu (UpdateTensors form) with the thread count
// replaced by a stream: one launch over `n` elements, bitwise equal to the CPU result for every
// n, alignment, dtype and split (vector and scalar items round identically). f32 parameters run
// the same kernels as bf16/f16 ones without a master (with an identity transform the gradient
// is used as is). Bad arguments (a negative n, null buffers that are used, an unknown dtype, a
// master for f32 or none for bf16/f16) raise Error(invalid_argument).
void sgd_update_cuda(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                     const GradTransform& gt, const Rounding& r, void* stream,
                     LaunchCache* cache = nullptr);
void adam_update_cuda(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                      float* max_exp_avg_sq, int64_t n, const AdamScalars& s,
                      const GradTransform& gt, const Rounding& r, void* stream,
                      LaunchCache* cache = nullptr);

// adam_update_q8_cpu's contract (8-bit blockwise moments, kernels/q8_state.hpp) with the thread
// count replaced by a stream: codes, absmax and parameters bitwise the CPU kernel's. With
// `master_remainder` set (bf16), sgd_update_cuda, adam_update_cuda and this one keep the master
// as the parameter and its remainder, as the CPU loops do (nearest rounding only).
void adam_update_q8_cuda(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                         const GradTransform& gt, const Rounding& r, void* stream);

// Writes out[0] = sum of squares (or max |g| when inf_norm) of the unscaled gradients, in
// double, and out[1] = 1.0 if any is inf/NaN else 0.0 — or combines into out[0..1] when
// `accumulate` (sum / max, flag OR). `out` is device memory (2 doubles). The order is the fixed
// one of kernels/grad_stats.hpp, so out[0] is bitwise grad_stats_cpu's value. `workspace`:
// reduction_workspace_bytes() of device scratch, or null (see below).
void grad_stats_cuda(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                     double* out, bool accumulate, void* workspace, void* stream);

// dst = the exact float of src / dst = src rounded to nearest-even (f32: a device copy).
void widen_cuda(const void* src, DType dtype, float* dst, int64_t n, void* stream,
                LaunchCache* cache = nullptr);
void narrow_cuda(const float* src, void* dst, DType dtype, int64_t n, void* stream,
                 LaunchCache* cache = nullptr);
// x[i] = narrow(widen(x[i]) / divisor), nearest-even (f32: x[i] / divisor, IEEE-rounded):
// bitwise divide_cpu, and so the average the MPI backend computes on the host for
// ReduceOp::avg, for the all-reduces that sum on device buffers.
void divide_cuda(void* x, DType dtype, int64_t n, float divisor, void* stream,
                 LaunchCache* cache = nullptr);

// Bytes of device scratch grad_stats_cuda uses; pass that much as its `workspace`, or null to
// have it allocated and freed in stream order (cudaMallocAsync) on each call (an optimizer
// passes its own, allocated once, so that a step allocates nothing).
std::size_t reduction_workspace_bytes();

}  // namespace kernels
}  // namespace shardopt
