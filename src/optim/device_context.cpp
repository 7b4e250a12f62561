// src/optim/device_context.cpp — device adoption, buffer allocation, and the copies and collective ordering of the step pipeline.
#include "optim/device_context.hpp"

#include <cstring>

#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
#include "optim/device_update.hpp"
#include "comm/host_staging.hpp"

namespace shardopt {
namespace optim {

DeviceContext::DeviceContext(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
  divisor_ = comm_->size();
  if (!comm_->device().is_cuda()) return;
  stream_ = comm_->cuda_stream();
  SHARDOPT_CHECK(stream_ != nullptr, unsupported,
                 "ZeroOptimizer: the '{}' communicator works on {} but runs no CUDA stream, so the optimizer "
                 "cannot order its kernels against its collectives",
                 comm_->backend_name(), device_name(comm_->device()));
  device_ = comm_->device();
  host_staging_ = std::make_unique<comm::HostStagedCommunicator>(*comm_, device_, stream_);
}

DeviceContext::~DeviceContext() = default;

void DeviceContext::adopt(Device device) {
  if (!device.is_cuda() || on_device()) return;
  SHARDOPT_CHECK(world() == 1 || comm_->cuda_aware(), unsupported,
                 "parameters on {} over the host-memory '{}' communicator of {} ranks need a CUDA-aware "
                 "communicator (a CUDA-aware MPI), but this one takes host memory only (rank {}); use "
                 "nccl_world() or nccl_borrow() for CUDA parameters",
                 device_name(device), comm_->backend_name(), world(), rank());
  own_stream_ = device::OwnedStream(device);
  stream_ = own_stream_.get();
  device_ = device;
  host_driven_ = world() > 1;
}

Communicator& DeviceContext::host_comm() const { return host_staging_ ? *host_staging_ : *comm_; }

core::FlatBuffer DeviceContext::new_buffer(int64_t numel, DType element_type) const {
  core::FlatBuffer buffer(device_, stream_, element_type);
  buffer.resize(numel);
  return buffer;
}

void DeviceContext::copy_bytes(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;  // empty shards have null buffers
  if (on_device()) {
    device::cuda_copy(dst, src, bytes, stream_, device_);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void DeviceContext::zero_bytes(void* dst, std::size_t bytes) const {
  if (bytes == 0) return;
  if (on_device()) {
    device::cuda_zero(dst, bytes, stream_, device_);
  } else {
    std::memset(dst, 0, bytes);
  }
}

void DeviceContext::synchronize(const char* what) const {
  if (on_device()) device::cuda_synchronize(stream_, device_, what);
}

void DeviceContext::settle_before_collective() const {
  if (host_driven_) device::cuda_synchronize(stream_, device_, "before a host-driven collective on device buffers");
}

void DeviceContext::finish_gradient_average(void* data, int64_t count, DType dtype) const {
  if (count <= 0 || (!host_driven_ && divisor_ == world())) return;
  if (on_device()) {
    divide_device(data, dtype, count, static_cast<float>(divisor_), stream_);
  } else {
    kernels::divide_cpu(data, dtype, count, static_cast<float>(divisor_), 1);
  }
}

}  // namespace optim
}  // namespace shardopt
