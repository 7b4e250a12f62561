// kernels/cuda/update_cuda.cpp — argument checks, launch planning and CUDA error translation for the CUDA kernels.
#include "cuda/update_cuda.hpp"

#include <cuda_runtime.h>

#include <string>

#include "core/check.hpp"
#include "cuda/cuda_launchers.hpp"

namespace shardopt {
namespace kernels {
namespace {

[[noreturn]] void raise_cuda(cudaError_t status, const char* what) {
  int device = -1;
  const std::string where = cudaGetDevice(&device) == cudaSuccess
                                ? fmt::format("cuda:{}", device)
                                : std::string("no usable CUDA device");
  cudaGetLastError();  // a failed launch's error is not sticky; leave none behind
  raise(ErrorCode::cuda, "{} failed ({}): {} ({})", what, where, cudaGetErrorString(status),
        cudaGetErrorName(status));
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) raise_cuda(status, what);
}

// One full wave of the kernel on the current device: SMs x resident blocks per SM.
int64_t one_wave_blocks(int blocks_per_sm_status, int blocks_per_sm, const char* what) {
  check_cuda(static_cast<cudaError_t>(blocks_per_sm_status), what);
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  int sms = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiProcessorCount)");
  return static_cast<int64_t>(sms > 0 ? sms : 1) * (blocks_per_sm > 0 ? blocks_per_sm : 1);
}

GridShape sgd_grid(const VectorPlan& plan, const SgdScalars& s) {
  int per_sm = 0;
  const int status = sgd_update_blocks_per_sm(s, &per_sm);
  return make_grid_shape(plan.items(), kUpdateThreads,
                         one_wave_blocks(status, per_sm, "sgd_update_cuda: occupancy"));
}

GridShape adam_grid(const VectorPlan& plan, const AdamScalars& s) {
  int per_sm = 0;
  const int status = adam_update_blocks_per_sm(s, &per_sm);
  return make_grid_shape(plan.items(), kUpdateThreads,
                         one_wave_blocks(status, per_sm, "adam_update_cuda: occupancy"));
}

void check_span(const void* p, int64_t n, const char* op, const char* name) {
  SHARDOPT_CHECK(p != nullptr, invalid_argument, "{}: `{}` is null for {} elements", op, name, n);
}

VectorPlan plan_sgd(const SgdBuffers& b, int64_t n, const SgdScalars& s) {
  std::uintptr_t addresses[kMaxPlanStreams];
  const int count = plan_addresses(b, s.use_momentum, addresses);
  return make_vector_plan(n, addresses, count);
}

VectorPlan plan_adam(const AdamBuffers& b, int64_t n, const AdamScalars& s) {
  std::uintptr_t addresses[kMaxPlanStreams];
  const int count = plan_addresses(b, s.amsgrad, addresses);
  return make_vector_plan(n, addresses, count);
}

VectorPlan plan_single(const float* x, int64_t n) {
  const std::uintptr_t address = reinterpret_cast<std::uintptr_t>(x);
  return make_vector_plan(n, &address, 1);
}

}  // namespace

void sgd_update_cuda(float* param, const float* grad, float* momentum_buf, int64_t n,
                     const SgdScalars& s, void* stream) {
  SHARDOPT_CHECK(n >= 0, invalid_argument, "sgd_update_cuda: negative element count {}", n);
  if (n == 0) return;
  check_span(param, n, "sgd_update_cuda", "param");
  check_span(grad, n, "sgd_update_cuda", "grad");
  if (s.use_momentum) check_span(momentum_buf, n, "sgd_update_cuda", "momentum_buf");
  const SgdBuffers buffers{param, grad, momentum_buf};
  const VectorPlan plan = plan_sgd(buffers, n, s);
  const GridShape grid = sgd_grid(plan, s);
  check_cuda(static_cast<cudaError_t>(launch_sgd_update(buffers, s, plan, grid, stream)),
             "sgd_update_cuda: kernel launch");
}

void adam_update_cuda(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                      float* max_exp_avg_sq, int64_t n, const AdamScalars& s, void* stream) {
  SHARDOPT_CHECK(n >= 0, invalid_argument, "adam_update_cuda: negative element count {}", n);
  if (n == 0) return;
  check_span(param, n, "adam_update_cuda", "param");
  check_span(grad, n, "adam_update_cuda", "grad");
  check_span(exp_avg, n, "adam_update_cuda", "exp_avg");
  check_span(exp_avg_sq, n, "adam_update_cuda", "exp_avg_sq");
  if (s.amsgrad) check_span(max_exp_avg_sq, n, "adam_update_cuda", "max_exp_avg_sq");
  const AdamBuffers buffers{param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq};
  const VectorPlan plan = plan_adam(buffers, n, s);
  const GridShape grid = adam_grid(plan, s);
  check_cuda(static_cast<cudaError_t>(launch_adam_update(buffers, s, plan, grid, stream)),
             "adam_update_cuda: kernel launch");
}

void divide_cuda(float* x, int64_t n, float divisor, void* stream) {
  SHARDOPT_CHECK(n >= 0, invalid_argument, "divide_cuda: negative element count {}", n);
  if (n == 0) return;
  check_span(x, n, "divide_cuda", "x");
  const VectorPlan plan = plan_single(x, n);
  int per_sm = 0;
  const int status = divide_blocks_per_sm(&per_sm);
  const GridShape grid = make_grid_shape(
      plan.items(), kUpdateThreads, one_wave_blocks(status, per_sm, "divide_cuda: occupancy"));
  check_cuda(static_cast<cudaError_t>(launch_divide(x, divisor, plan, grid, stream)),
             "divide_cuda: kernel launch");
}

std::size_t reduction_workspace_bytes() {
  return static_cast<std::size_t>(kReduceMaxBlocks) * sizeof(float);
}

void squared_norm_cuda(const float* x, int64_t n, float* out, bool accumulate, void* workspace,
                       void* stream) {
  SHARDOPT_CHECK(n >= 0, invalid_argument, "squared_norm_cuda: negative element count {}", n);
  SHARDOPT_CHECK(out != nullptr, invalid_argument, "squared_norm_cuda: `out` is null");
  if (n > 0) check_span(x, n, "squared_norm_cuda", "x");
  const VectorPlan plan = plan_single(x, n);
  // The grid depends on n alone (not on the device), which fixes the summation order.
  const GridShape grid = make_grid_shape(plan.items(), kReduceThreads, kReduceMaxBlocks);
  const auto s = static_cast<cudaStream_t>(stream);
  void* partials = workspace;
  const bool own_workspace = workspace == nullptr && grid.blocks > 0;
  if (own_workspace) {
    check_cuda(cudaMallocAsync(&partials, reduction_workspace_bytes(), s),
               "squared_norm_cuda: cudaMallocAsync(workspace)");
  }
  const auto status = static_cast<cudaError_t>(launch_squared_norm(
      x, plan, grid, static_cast<float*>(partials), out, accumulate, stream));
  // Freed in stream order after the kernels, whether or not they launched.
  if (own_workspace) cudaFreeAsync(partials, s);
  check_cuda(status, "squared_norm_cuda: kernel launch");
}

void any_nonfinite_cuda(const float* x, int64_t n, int32_t* found, void* stream) {
  SHARDOPT_CHECK(n >= 0, invalid_argument, "any_nonfinite_cuda: negative element count {}", n);
  SHARDOPT_CHECK(found != nullptr, invalid_argument, "any_nonfinite_cuda: `found` is null");
  if (n == 0) return;
  check_span(x, n, "any_nonfinite_cuda", "x");
  const VectorPlan plan = plan_single(x, n);
  int per_sm = 0;
  const int status = any_nonfinite_blocks_per_sm(&per_sm);
  const GridShape grid = make_grid_shape(
      plan.items(), kReduceThreads, one_wave_blocks(status, per_sm, "any_nonfinite_cuda: occupancy"));
  check_cuda(static_cast<cudaError_t>(launch_any_nonfinite(x, plan, grid, found, stream)),
             "any_nonfinite_cuda: kernel launch");
}

bool cuda_device_available(std::string* reason) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (reason) *reason = cudaGetErrorString(status);
    cudaGetLastError();  // not sticky, but leave no error behind for the caller's next check
    return false;
  }
  if (count == 0) {
    if (reason) *reason = "cudaGetDeviceCount reported 0 devices";
    return false;
  }
  return true;
}

CudaLaunchInfo adam_launch_info(const float* param, const float* grad, const float* exp_avg,
                                const float* exp_avg_sq, const float* max_exp_avg_sq, int64_t n,
                                const AdamScalars& s) {
  const AdamBuffers buffers{const_cast<float*>(param), grad, const_cast<float*>(exp_avg),
                            const_cast<float*>(exp_avg_sq), const_cast<float*>(max_exp_avg_sq)};
  const VectorPlan plan = plan_adam(buffers, n, s);
  const GridShape grid = adam_grid(plan, s);
  CudaLaunchInfo info;
  info.items = plan.items();
  info.vector_items = plan.vectors;
  info.blocks = grid.blocks;
  info.threads = grid.threads;
  return info;
}

}  // namespace kernels
}  // namespace shardopt
