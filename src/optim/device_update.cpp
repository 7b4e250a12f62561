// src/optim/device_update.cpp — device_update.hpp over kernels/cuda, or Error(unsupported) in a build without CUDA.
#include "optim/device_update.hpp"

#include "core/check.hpp"

#if SHARDOPT_HAVE_CUDA
#include "cuda/update_cuda.hpp"
#endif

namespace shardopt {
namespace optim {

#if SHARDOPT_HAVE_CUDA

void sgd_update_device(const kernels::UpdateTensors& t, float* momentum_buf, int64_t n,
                       const kernels::SgdScalars& s, const kernels::GradTransform& gt,
                       const kernels::Rounding& r, void* stream) {
  kernels::sgd_update_cuda(t, momentum_buf, n, s, gt, r, stream);
}

void adam_update_device(const kernels::UpdateTensors& t, float* exp_avg, float* exp_avg_sq,
                        float* max_exp_avg_sq, int64_t n, const kernels::AdamScalars& s,
                        const kernels::GradTransform& gt, const kernels::Rounding& r,
                        void* stream) {
  kernels::adam_update_cuda(t, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, gt, r, stream);
}

void grad_stats_device(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm,
                       double* out, bool accumulate, void* workspace, void* stream) {
  kernels::grad_stats_cuda(grad, dtype, n, unscale, inf_norm, out, accumulate, workspace, stream);
}

void divide_device(void* x, DType dtype, int64_t n, float divisor, void* stream) {
  kernels::divide_cuda(x, dtype, n, divisor, stream);
}

#else

namespace {
[[noreturn]] void no_cuda(const char* what) {
  raise(ErrorCode::unsupported, "{}: this build has no CUDA support", what);
}
}  // namespace

void sgd_update_device(const kernels::UpdateTensors&, float*, int64_t, const kernels::SgdScalars&,
                       const kernels::GradTransform&, const kernels::Rounding&, void*) {
  no_cuda("sgd_update_device");
}
void adam_update_device(const kernels::UpdateTensors&, float*, float*, float*, int64_t,
                        const kernels::AdamScalars&, const kernels::GradTransform&,
                        const kernels::Rounding&, void*) {
  no_cuda("adam_update_device");
}
void grad_stats_device(const void*, DType, int64_t, float, bool, double*, bool, void*, void*) {
  no_cuda("grad_stats_device");
}
void divide_device(void*, DType, int64_t, float, void*) { no_cuda("divide_device"); }

#endif

}  // namespace optim
}  // namespace shardopt
