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

// Bytes of device scratch the reductions below use; pass that much as `workspace`, or null to
// have it allocated and freed in stream order (cudaMallocAsync) on each call.
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
