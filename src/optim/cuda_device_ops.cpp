// src/optim/cuda_device_ops.cpp — DeviceOps over the CUDA runtime and kernels/cuda, with the launch parameters kept per optimizer; Error(unsupported) without CUDA.
#include "optim/device_ops.hpp"

#include <memory>
#include <vector>

#include "core/check.hpp"
#include "core/device_memory.hpp"

#if SHARDOPT_HAVE_CUDA
#include "cuda/muon_cuda.hpp"
#include "cuda/update_cuda.hpp"
#endif

namespace shardopt {
namespace optim {

void DeviceOps::muon_update(const kernels::UpdateTensors&, float*, int64_t, int64_t, const kernels::MuonScalars&,
                            const kernels::GradTransform&, const kernels::Rounding&, kernels::MuonPrecision, void*) {
  raise(ErrorCode::unsupported, "Muon: this device implementation has no Newton-Schulz");
}

void DeviceOps::adam_update_q8(const kernels::UpdateTensors&, const kernels::Q8Moments&, int64_t,
                               const kernels::AdamScalars&, const kernels::GradTransform&, const kernels::Rounding&,
                               void*) {
  raise(ErrorCode::unsupported, "state_precision = q8: this device implementation has no 8-bit update");
}

#if SHARDOPT_HAVE_CUDA

namespace {

class CudaDeviceOps final : public DeviceOps {
 public:
  explicit CudaDeviceOps(Device device) : device_(device) {}

  core::FlatBuffer new_buffer(int64_t numel, DType dtype, void* stream) override {
    core::FlatBuffer buffer(device_, stream, dtype);
    buffer.resize(numel);
    return buffer;
  }
  void copy(void* dst, const void* src, std::size_t bytes, void* stream) override {
    device::cuda_copy(dst, src, bytes, stream, device_);
  }
  void zero(void* dst, std::size_t bytes, void* stream) override { device::cuda_zero(dst, bytes, stream, device_); }
  void synchronize(void* stream, const char* why) override { device::cuda_synchronize(stream, device_, why); }

  void* create_stream() override {
    device::OwnedStream owned(device_);
    streams_.push_back(std::move(owned));
    return streams_.back().get();
  }
  void destroy_stream(void* stream) noexcept override {
    for (auto it = streams_.begin(); it != streams_.end(); ++it) {
      if (it->get() == stream) {
        streams_.erase(it);
        return;
      }
    }
  }
  void* create_event() override { return device::cuda_event_create(device_); }
  void destroy_event(void* event) noexcept override { device::cuda_event_destroy(event); }
  void record_event(void* event, void* stream) override { device::cuda_event_record(event, stream, device_); }
  void stream_wait_event(void* stream, void* event) override {
    device::cuda_stream_wait_event(stream, event, device_);
  }

  void sgd_update(const kernels::UpdateTensors& t, float* momentum_buf, int64_t n, const kernels::SgdScalars& s,
                  const kernels::GradTransform& gt, const kernels::Rounding& r, void* stream) override {
    kernels::sgd_update_cuda(t, momentum_buf, n, s, gt, r, stream, &launch_);
  }
  void adam_update(const kernels::UpdateTensors& t, float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq,
                   int64_t n, const kernels::AdamScalars& s, const kernels::GradTransform& gt,
                   const kernels::Rounding& r, void* stream) override {
    kernels::adam_update_cuda(t, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s, gt, r, stream, &launch_);
  }
  void adam_update_q8(const kernels::UpdateTensors& t, const kernels::Q8Moments& q, int64_t n,
                      const kernels::AdamScalars& s, const kernels::GradTransform& gt, const kernels::Rounding& r,
                      void* stream) override {
    kernels::adam_update_q8_cuda(t, q, n, s, gt, r, stream);
  }
  void grad_stats(const void* grad, DType dtype, int64_t n, float unscale, bool inf_norm, double* out,
                  bool accumulate, void* workspace, void* stream) override {
    kernels::grad_stats_cuda(grad, dtype, n, unscale, inf_norm, out, accumulate, workspace, stream);
  }
  std::size_t grad_stats_workspace_bytes() const override { return kernels::reduction_workspace_bytes(); }
  void divide(void* x, DType dtype, int64_t n, float divisor, void* stream) override {
    kernels::divide_cuda(x, dtype, n, divisor, stream, &launch_);
  }
  void widen(const void* src, DType dtype, float* dst, int64_t n, void* stream) override {
    kernels::widen_cuda(src, dtype, dst, n, stream, &launch_);
  }
  void narrow(const float* src, void* dst, DType dtype, int64_t n, void* stream) override {
    kernels::narrow_cuda(src, dst, dtype, n, stream, &launch_);
  }
  void muon_update(const kernels::UpdateTensors& t, float* momentum_buf, int64_t rows, int64_t cols,
                   const kernels::MuonScalars& s, const kernels::GradTransform& gt, const kernels::Rounding& r,
                   kernels::MuonPrecision precision, void* stream) override {
    if (!muon_) muon_ = std::make_unique<kernels::MuonCudaWorkspace>();  // only optimizers with Muon groups
    kernels::muon_update_cuda(t, momentum_buf, rows, cols, s, gt, r, precision, *muon_, stream);
  }

 private:
  Device device_;
  kernels::LaunchCache launch_;  // SM count and occupancy, queried on a kernel's first launch only
  std::vector<device::OwnedStream> streams_;
  std::unique_ptr<kernels::MuonCudaWorkspace> muon_;  // declared last: freed before the streams
};

}  // namespace

std::unique_ptr<DeviceOps> make_cuda_device_ops(Device device) { return std::make_unique<CudaDeviceOps>(device); }

#else

std::unique_ptr<DeviceOps> make_cuda_device_ops(Device device) {
  raise(ErrorCode::unsupported, "{}: this build has no CUDA support", device_name(device));
}

#endif

}  // namespace optim
}  // namespace shardopt
