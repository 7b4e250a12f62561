// src/optim/muon_update.cpp — one Muon matrix's update: checks that it is whole, torch's scalars, and the kernel.
#include "optim/muon_update.hpp"

#include "core/check.hpp"

#if SHARDOPT_HAVE_CUDA
#include "cuda/cublas_loader.hpp"
#endif
#include "optim/device_ops.hpp"

namespace shardopt {
namespace optim {

#if SHARDOPT_HAVE_CUDA
std::string muon_cuda_unavailable_reason() {
  const std::string& failure = kernels::cublas_load_failure();
  return failure.empty() ? std::string() : "cuBLAS cannot be loaded: " + failure;
}
#else
std::string muon_cuda_unavailable_reason() { return "this build has no CUDA support"; }
#endif

void MuonUpdate::update(const UpdateRun& run, const ParamRecord& p, const Hyperparams& h,
                        const kernels::GradTransform& transform) {
  SHARDOPT_CHECK(p.shape.size() == 2 && run.length == p.numel, internal,
                 "Muon: parameter '{}' reached the update in a piece of {} of its {} elements (a Muon matrix is "
                 "owned whole)",
                 p.name, run.length, p.numel);
  const int64_t rows = p.shape[0];
  const int64_t cols = p.shape[1];
  const kernels::MuonScalars s =
      kernels::make_muon_scalars(h.lr, h.weight_decay, h.momentum, h.nesterov, h.ns_coefficients, h.ns_steps, h.eps,
                                 static_cast<int>(h.adjust_lr_fn), rows, cols);
  const DType dt = shard_.dtype();
  kernels::UpdateTensors tensors;
  tensors.param = run.param;
  tensors.grad = run.grad;
  tensors.master = dt == DType::f32 ? nullptr : shard_.state_data(kMaster) + run.shard_offset;
  tensors.dtype = dt;
  kernels::Rounding rounding;
  rounding.stochastic = config_.stochastic_rounding;
  rounding.seed = config_.rounding_seed;
  rounding.step = static_cast<uint64_t>(p.step + 1);
  rounding.first_index = static_cast<uint64_t>(run.first_index);
  const kernels::MuonPrecision precision =
      config_.muon.precision == MatrixPrecision::f32 ? kernels::MuonPrecision::f32 : kernels::MuonPrecision::bf16;
  float* momentum = shard_.state_data(kMomentum) + run.state_offset[kMomentum];  // packed over the params that keep it
  if (dev_.on_device()) {
    dev_.ops().muon_update(tensors, momentum, rows, cols, s, transform, rounding, precision, dev_.stream());
    return;
  }
  kernels::muon_update_cpu(tensors, momentum, rows, cols, s, transform,
                           rounding, precision, config_.muon.blas_threads, workspace_);
}

}  // namespace optim
}  // namespace shardopt
