// src/optim/device_update.cpp — device_update.hpp over kernels/cuda, or Error(unsupported) in a build without CUDA.
#include "optim/device_update.hpp"

#include "core/check.hpp"

#if SHARDOPT_HAVE_CUDA
#include "cuda/update_cuda.hpp"
#endif

namespace shardopt {
namespace optim {

#if SHARDOPT_HAVE_CUDA

void sgd_update_device(float* param, const float* grad, float* momentum_buf, int64_t n,
                       const kernels::SgdScalars& s, void* stream) {
  kernels::sgd_update_cuda(param, grad, momentum_buf, n, s, stream);
}

void adam_update_device(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                        float* max_exp_avg_sq, int64_t n, const kernels::AdamScalars& s,
                        void* stream) {
  kernels::adam_update_cuda(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, stream);
}

void divide_device(float* x, int64_t n, float divisor, void* stream) {
  kernels::divide_cuda(x, n, divisor, stream);
}

#else

namespace {
[[noreturn]] void no_cuda(const char* what) {
  raise(ErrorCode::unsupported, "{}: this build has no CUDA support", what);
}
}  // namespace

void sgd_update_device(float*, const float*, float*, int64_t, const kernels::SgdScalars&, void*) {
  no_cuda("sgd_update_device");
}
void adam_update_device(float*, const float*, float*, float*, float*, int64_t,
                        const kernels::AdamScalars&, void*) {
  no_cuda("adam_update_device");
}
void divide_device(float*, int64_t, float, void*) { no_cuda("divide_device"); }

#endif

}  // namespace optim
}  // namespace shardopt
