// kernels/cuda/update_cuda.cpp — argument checks, launch planning and CUDA error translation for the CUDA kernels.
#include "cuda/update_cuda.hpp"

#include <cuda_runtime.h>

#include <string>

#include "cuda/compact_launchers.hpp"
#include "cuda/cuda_launchers.hpp"
#include "grad_stats.hpp"
#include "kernel_check.hpp"
#include "update_checks.hpp"

namespace shardopt {
namespace kernels {
namespace {

[[noreturn]] void raise_cuda(cudaError_t status, const char* what) {
  int device = -1;
  const std::string where = cudaGetDevice(&device) == cudaSuccess
                                ? fmt::format("cuda:{}", device)
                                : std::string("no usable CUDA device");
  cudaGetLastError();  // a failed launch's error is not sticky; leave none behind
  raise_error(ErrorCode::cuda, "{} failed ({}): {} ({})", what, where, cudaGetErrorString(status),
              cudaGetErrorName(status));
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) raise_cuda(status, what);
}

int dtype_index(DType dtype) { return dtype == DType::f32 ? 0 : dtype == DType::bf16 ? 1 : 2; }

// One full wave of a kernel on the current device: SMs x resident blocks per SM. `query`
// fills its argument with the kernel's blocks per SM and returns a cudaError_t as int. With a
// cache, the runtime is asked only the first time (the device and SM count once per cache, the
// occupancy once per kernel).
template <typename Query>
int64_t one_wave_blocks(LaunchCache* cache, int slot, const Query& query, const char* what) {
  // The occupancy first: its failure (no device, say) names the launch that asked.
  int blocks_per_sm = cache != nullptr ? cache->blocks_per_sm(slot) : 0;
  if (blocks_per_sm == 0) {
    check_cuda(static_cast<cudaError_t>(query(&blocks_per_sm)), what);
    if (blocks_per_sm <= 0) blocks_per_sm = 1;
    if (cache != nullptr) {
      cache->set_blocks_per_sm(slot, blocks_per_sm);
      cache->count_query();
    }
  }
  int sms = cache != nullptr ? cache->sms() : 0;
  if (sms == 0) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
    if (sms <= 0) sms = 1;
    if (cache != nullptr) {
      cache->set_device(device, sms);
      cache->count_query();
    }
  }
  return static_cast<int64_t>(sms) * blocks_per_sm;
}

void check_span(const void* p, int64_t n, const char* op, const char* name) {
  SHARDOPT_KERNEL_CHECK(p != nullptr, invalid_argument, "{}: `{}` is null for {} elements", op, name,
                        n);
}

// A device buffer of reduction_workspace_bytes(): the caller's, or one allocated and freed
// in stream order around the launches.
class Workspace {
 public:
  Workspace(void* given, bool needed, cudaStream_t stream, const char* what) : ptr_(given), stream_(stream) {
    if (given == nullptr && needed) {
      check_cuda(cudaMallocAsync(&ptr_, reduction_workspace_bytes(), stream), what);
      owned_ = true;
    }
  }
  ~Workspace() {
    if (owned_) cudaFreeAsync(ptr_, stream_);  // after the kernels, whether or not they launched
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

CompactCommon compact_common(const UpdateTensors& t, int64_t n, const GradTransform& gt, const Rounding& r) {
  CompactCommon c;
  c.t = t;
  c.gt = gt;
  c.transform = !is_identity(gt);
  c.stochastic = r.stochastic && t.dtype != DType::f32 && t.master_remainder == nullptr;
  c.step_key = rounding_step_key(r.seed, r.step);
  c.first_index = r.first_index;
  c.n = n;
  return c;
}

MixedCommon mixed_common(const UpdateTensors& t, const GradTransform& gt, const Rounding& r) {
  MixedCommon c;
  c.param = t.param;
  c.grad = t.grad;
  c.master = t.master;
  c.gt = gt;
  c.transform = !is_identity(gt);
  c.step_key = rounding_step_key(r.seed, r.step);
  c.first_index = r.first_index;
  return c;
}

VectorPlan plan_mixed(const MixedCommon& c, DType dtype, const float* const* states, int count,
                      int64_t n) {
  std::uintptr_t addresses[kMaxMixedStreams];
  int sizes[kMaxMixedStreams];
  const int streams = mixed_plan_streams(c, dtype, states, count, addresses, sizes);
  return make_vector_plan(n, addresses, sizes, streams);
}

// The plan over one buffer of `dtype` elements, or a float buffer and a 16-bit one.
VectorPlan plan_typed(int64_t n, const void* a, int a_bytes, const void* b = nullptr, int b_bytes = 0) {
  const std::uintptr_t addresses[2] = {reinterpret_cast<std::uintptr_t>(a),
                                       reinterpret_cast<std::uintptr_t>(b)};
  const int sizes[2] = {a_bytes, b_bytes};
  return make_vector_plan(n, addresses, sizes, b ? 2 : 1);
}

GridShape convert_grid(const VectorPlan& plan, ConvertKind kind, DType dtype, LaunchCache* cache,
                       const char* what) {
  const LaunchKernel kernel = kind == ConvertKind::widen    ? LaunchKernel::widen
                              : kind == ConvertKind::narrow ? LaunchKernel::narrow
                                                            : LaunchKernel::divide;
  const int slot = LaunchCache::slot(kernel, dtype_index(dtype), false, false);
  return make_grid_shape(
      plan.items(), kUpdateThreads,
      one_wave_blocks(cache, slot, [&](int* per_sm) { return convert_blocks_per_sm(kind, dtype, per_sm); }, what));
}

}  // namespace

void sgd_update_cuda(const UpdateTensors& t, float* momentum_buf, int64_t n, const SgdScalars& s,
                     const GradTransform& gt, const Rounding& r, void* stream, LaunchCache* cache) {
  const char* op = "sgd_update_cuda";
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  if (n == 0) return;
  check_update_tensors(t, op);
  if (s.use_momentum) check_span(momentum_buf, n, op, "momentum_buf");
  if (t.master_remainder != nullptr) {
    check_remainder_rounding(t, r, op);
    check_cuda(static_cast<cudaError_t>(launch_sgd_remainder(compact_common(t, n, gt, r), momentum_buf, s, stream)),
               "sgd_update_cuda: kernel launch (master remainders)");
    return;
  }
  MixedSgdArgs args;
  args.common = mixed_common(t, gt, r);
  args.dtype = t.dtype;
  args.stochastic = r.stochastic && t.dtype != DType::f32;
  args.momentum_buf = s.use_momentum ? momentum_buf : nullptr;
  args.s = s;
  const float* states[] = {args.momentum_buf};
  const VectorPlan plan = plan_mixed(args.common, t.dtype, states, 1, n);
  const int slot = LaunchCache::slot(LaunchKernel::sgd, dtype_index(t.dtype), args.stochastic, s.use_momentum);
  const GridShape grid = make_grid_shape(
      plan.items(), kUpdateThreads,
      one_wave_blocks(cache, slot, [&](int* per_sm) { return mixed_sgd_blocks_per_sm(args, per_sm); },
                      "sgd_update_cuda: occupancy"));
  check_cuda(static_cast<cudaError_t>(launch_mixed_sgd(args, plan, grid, stream)),
             "sgd_update_cuda: kernel launch");
}

void adam_update_cuda(const UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                      float* max_exp_avg_sq, int64_t n, const AdamScalars& s,
                      const GradTransform& gt, const Rounding& r, void* stream, LaunchCache* cache) {
  const char* op = "adam_update_cuda";
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  if (n == 0) return;
  check_update_tensors(t, op);
  check_span(exp_avg, n, op, "exp_avg");
  check_span(exp_avg_sq, n, op, "exp_avg_sq");
  if (s.amsgrad) check_span(max_exp_avg_sq, n, op, "max_exp_avg_sq");
  if (t.master_remainder != nullptr) {
    check_remainder_rounding(t, r, op);
    check_cuda(static_cast<cudaError_t>(launch_adam_remainder(compact_common(t, n, gt, r), exp_avg, exp_avg_sq,
                                                              max_exp_avg_sq, s, stream)),
               "adam_update_cuda: kernel launch (master remainders)");
    return;
  }
  MixedAdamArgs args;
  args.common = mixed_common(t, gt, r);
  args.dtype = t.dtype;
  args.stochastic = r.stochastic && t.dtype != DType::f32;
  args.exp_avg = exp_avg;
  args.exp_avg_sq = exp_avg_sq;
  args.max_exp_avg_sq = s.amsgrad ? max_exp_avg_sq : nullptr;
  args.s = s;
  const float* states[] = {args.exp_avg, args.exp_avg_sq, args.max_exp_avg_sq};
  const VectorPlan plan = plan_mixed(args.common, t.dtype, states, 3, n);
  const int slot = LaunchCache::slot(LaunchKernel::adam, dtype_index(t.dtype), args.stochastic, s.amsgrad);
  const GridShape grid = make_grid_shape(
      plan.items(), kUpdateThreads,
      one_wave_blocks(cache, slot, [&](int* per_sm) { return mixed_adam_blocks_per_sm(args, per_sm); },
                      "adam_update_cuda: occupancy"));
  check_cuda(static_cast<cudaError_t>(launch_mixed_adam(args, plan, grid, stream)),
             "adam_update_cuda: kernel launch");
}

void adam_update_q8_cuda(const UpdateTensors& t, const Q8Moments& q, int64_t n, const AdamScalars& s,
                         const GradTransform& gt, const Rounding& r, void* stream) {
  const char* op = "adam_update_q8_cuda";
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  if (n == 0) return;
  check_update_tensors(t, op);
  check_remainder_rounding(t, r, op);
  check_span(q.exp_avg, n, op, "exp_avg");
  check_span(q.exp_avg_sq, n, op, "exp_avg_sq");
  check_span(q.exp_avg_absmax, q8_blocks(n), op, "exp_avg_absmax");
  check_span(q.exp_avg_sq_absmax, q8_blocks(n), op, "exp_avg_sq_absmax");
  SHARDOPT_KERNEL_CHECK(!s.amsgrad, invalid_argument, "{}: amsgrad keeps max_exp_avg_sq, which has no 8-bit form", op);
  check_cuda(static_cast<cudaError_t>(launch_adam_q8(compact_common(t, n, gt, r), q, s, stream)),
             "adam_update_q8_cuda: kernel launch");
}

void grad_stats_cuda(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                     double* out, bool accumulate, void* workspace, void* stream) {
  const char* op = "grad_stats_cuda";
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  SHARDOPT_KERNEL_CHECK(out != nullptr, invalid_argument, "{}: `out` is null", op);
  check_dtype(dtype, op);
  if (n > 0) check_span(grad, n, op, "grad");
  const auto s = static_cast<cudaStream_t>(stream);
  // The kernels need the workspace only when there are groups (n > 0).
  const Workspace partials(workspace, n > 0, s, "grad_stats_cuda: cudaMallocAsync(workspace)");
  check_cuda(static_cast<cudaError_t>(launch_grad_stats(grad, dtype, n, unscale, inf_norm,
                                                        static_cast<double*>(partials.get()),
                                                        out, accumulate, stream)),
             "grad_stats_cuda: kernel launch");
}

namespace {

// widen_cuda / narrow_cuda: the same checks, an f32 copy, or one conversion launch over a plan
// of the two element sizes (f32 on the `kind`'s wide side).
template <typename Launch>
void convert_cuda(const char* op, ConvertKind kind, const void* src, void* dst, DType dtype, int64_t n,
                  void* stream, LaunchCache* cache, const Launch& launch) {
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  check_dtype(dtype, op);
  if (n == 0) return;
  check_span(src, n, op, "src");
  check_span(dst, n, op, "dst");
  if (dtype == DType::f32) {
    check_cuda(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                               cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
               fmt::format("{}: cudaMemcpyAsync", op).c_str());
    return;
  }
  const int narrow_bytes = static_cast<int>(dtype_size(dtype));
  const int wide_bytes = static_cast<int>(sizeof(float));
  const VectorPlan plan = kind == ConvertKind::widen ? plan_typed(n, src, narrow_bytes, dst, wide_bytes)
                                                     : plan_typed(n, src, wide_bytes, dst, narrow_bytes);
  const GridShape grid = convert_grid(plan, kind, dtype, cache, op);
  check_cuda(static_cast<cudaError_t>(launch(plan, grid)), fmt::format("{}: kernel launch", op).c_str());
}

}  // namespace

void widen_cuda(const void* src, DType dtype, float* dst, int64_t n, void* stream, LaunchCache* cache) {
  convert_cuda("widen_cuda", ConvertKind::widen, src, dst, dtype, n, stream, cache,
               [&](const VectorPlan& plan, const GridShape& grid) { return launch_widen(src, dtype, dst, plan, grid, stream); });
}

void narrow_cuda(const float* src, void* dst, DType dtype, int64_t n, void* stream, LaunchCache* cache) {
  convert_cuda("narrow_cuda", ConvertKind::narrow, src, dst, dtype, n, stream, cache,
               [&](const VectorPlan& plan, const GridShape& grid) { return launch_narrow(src, dst, dtype, plan, grid, stream); });
}

void divide_cuda(void* x, DType dtype, int64_t n, float divisor, void* stream, LaunchCache* cache) {
  const char* op = "divide_cuda";
  SHARDOPT_KERNEL_CHECK(n >= 0, invalid_argument, "{}: negative element count {}", op, n);
  check_dtype(dtype, op);
  if (n == 0) return;
  check_span(x, n, op, "x");
  const VectorPlan plan = plan_typed(n, x, static_cast<int>(dtype_size(dtype)));
  const GridShape grid = convert_grid(plan, ConvertKind::divide, dtype, cache, "divide_cuda: occupancy");
  check_cuda(static_cast<cudaError_t>(launch_divide(x, dtype, divisor, plan, grid, stream)),
             "divide_cuda: kernel launch");
}

std::size_t reduction_workspace_bytes() {
  return static_cast<std::size_t>(kStatsMaxGroups) * 2 * sizeof(double);
}

}  // namespace kernels
}  // namespace shardopt
