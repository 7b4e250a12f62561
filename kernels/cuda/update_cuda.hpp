// kernels/cuda/update_cuda.hpp — the CUDA update rules and reductions, callable from plain C++ (streams are opaque).
//
// Nothing here needs cuda_runtime.h: a stream is passed as `void*` holding a cudaStream_t
// (null means the legacy default stream). Every function only enqueues work on that stream
// and returns; failures to launch raise shardopt::Error(cuda), bad arguments
// Error(invalid_argument). All pointers are device (or managed) memory on the current device.
// Only available when the library was built with CUDA (SHARDOPT_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mixed_update.hpp"
#include "shardopt/types.hpp"
#include "update_rules.hpp"

namespace shardopt {
namespace kernels {

// The same contract as sgd_update_cpu / adam_update_cpu with the thread count replaced by a
// stream: one launch over `n` elements, bitwise equal to the CPU result for every n, alignment
// and shard boundary (vector and scalar paths round identically).
void sgd_update_cuda(float* param, const float* grad, float* momentum_buf, int64_t n,
                     const SgdScalars& s, void* stream);
void adam_update_cuda(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      float* max_exp_avg_sq, int64_t n, const AdamScalars& s, void* stream);

// x[i] = x[i] / divisor, IEEE-rounded: bitwise the average MpiCommunicator computes on the host
// for ReduceOp::avg, for the all-reduces a CUDA-aware MPI sums on device buffers.
void divide_cuda(float* x, int64_t n, float divisor, void* stream);

// ---- mixed precision: the contract of sgd_update_cpu / adam_update_cpu (UpdateTensors form) ----
// with the thread count replaced by a stream, bitwise equal to the CPU result for every n,
// alignment and split. f32 with an identity transform runs the kernels above; everything else
// runs the mixed kernels (the same launch plan, with 8-byte vector accesses to 16-bit streams).
// Bad arguments (null buffers, a master for f32 or none for bf16/f16) raise
// Error(invalid_argument).
void sgd_update_cuda(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                     const GradTransform& gt, const Rounding& r, void* stream);
void adam_update_cuda(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                      float* max_exp_avg_sq, int64_t n, const AdamScalars& s,
                      const GradTransform& gt, const Rounding& r, void* stream);

// Writes out[0] = sum of squares (or max |g| when inf_norm) of the unscaled gradients, in
// double, and out[1] = 1.0 if any is inf/NaN else 0.0 — or combines into out[0..1] when
// `accumulate` (sum / max, flag OR). `out` is device memory (2 doubles). The order is the fixed
// one of kernels/grad_stats.hpp, so out[0] is bitwise grad_stats_cpu's value. `workspace`:
// reduction_workspace_bytes() of device scratch, or null (see below).
void grad_stats_cuda(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                     double* out, bool accumulate, void* workspace, void* stream);

// dst = the exact float of src / dst = src rounded to nearest-even (f32: a device copy).
void widen_cuda(const void* src, DType dtype, float* dst, int64_t n, void* stream);
void narrow_cuda(const float* src, void* dst, DType dtype, int64_t n, void* stream);
// x[i] = narrow(widen(x[i]) / divisor), nearest-even: divide_cuda above for any dtype, bitwise
// divide_cpu.
void divide_cuda(void* x, DType dtype, int64_t n, float divisor, void* stream);

// Bytes of device scratch the reductions (squared_norm_cuda, grad_stats_cuda) use; pass that
// much as `workspace`, or null to have it allocated and freed in stream order
// (cudaMallocAsync) on each call.
std::size_t reduction_workspace_bytes();

// *out = sum of x[i]^2 (or *out += it when `accumulate`, to combine several buffers), in float.
// Deterministic: the summation order depends only on n and x's offset from a 16-byte boundary,
// never on the device or on timing (block partials, then one block sums them in order).
void squared_norm_cuda(const float* x, int64_t n, float* out, bool accumulate, void* workspace,
                       void* stream);

// Sets *found to 1 when x holds an inf or NaN and never clears it, so one flag can collect
// several buffers (as torch's found_inf); zero it before the first buffer.
void any_nonfinite_cuda(const float* x, int64_t n, int32_t* found, void* stream);

// Whether a CUDA device can be used; when not, `reason` (if given) says why, e.g. "CUDA driver
// version is insufficient for CUDA runtime version". For tests, benchmarks and tools that
// decide between the CPU and CUDA paths without including cuda_runtime.h.
bool cuda_device_available(std::string* reason = nullptr);

// What one update launch looks like for n elements at the given addresses (for benchmarks
// and logs): items of the plan, blocks x threads of the single launch.
struct CudaLaunchInfo {
  int64_t items = 0;
  int64_t vector_items = 0;
  int64_t blocks = 0;
  int threads = 0;
};
CudaLaunchInfo adam_launch_info(const float* param, const float* grad, const float* exp_avg,
                                const float* exp_avg_sq, const float* max_exp_avg_sq, int64_t n,
                                const AdamScalars& s);

}  // namespace kernels
}  // namespace shardopt
