// src/optim/device_context.hpp — where the optimizer's buffers live and how its copies and collectives are ordered (host, or one CUDA device and its stream).
#pragma once

#include <cstddef>
#include <memory>

#include "core/device_memory.hpp"
#include "core/flat_buffer.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace optim {

class DeviceContext {
 public:
  // A communicator that runs on a CUDA stream (NCCL) fixes the device and the stream now.
  explicit DeviceContext(std::shared_ptr<Communicator> comm);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  // The first CUDA parameters over a host communicator: over several ranks only a CUDA-aware
  // communicator can take device buffers (checked here, Error(unsupported) naming why not).
  void adopt(Device device);

  Communicator& comm() const { return *comm_; }
  const std::shared_ptr<Communicator>& shared_comm() const { return comm_; }
  // The optimizer's own small host-side collectives (agreement records): for a communicator
  // that takes device buffers only, a view that stages them through device memory.
  Communicator& host_comm() const;
  int rank() const { return comm_->rank(); }
  int world() const { return comm_->size(); }
  Device device() const { return device_; }
  void* stream() const { return stream_; }
  bool on_device() const { return device_.is_cuda(); }

  core::FlatBuffer new_buffer(int64_t numel, DType element_type = DType::f32) const;
  // memcpy/memset on the host; on a device, enqueued on the stream.
  void copy_bytes(void* dst, const void* src, std::size_t bytes) const;
  void zero_bytes(void* dst, std::size_t bytes) const;
  // Waits for the stream when the caller needs its results on the host.
  void synchronize(const char* what) const;

  // Before a collective on device buffers: a stream-ordered communicator needs nothing; a
  // CUDA-aware host communicator reads them on the host's timeline, after the stream's work.
  void settle_before_collective() const;
  // Averaging gradients: avg, or (host-driven device collectives) sum and then
  // finish_gradient_average's division on the stream.
  ReduceOp gradient_average_op() const {
    return host_driven_ || divisor_ != world() ? ReduceOp::sum : ReduceOp::avg;
  }
  void finish_gradient_average(void* data, int64_t count, DType dtype) const;
  // The number the gradient sums are divided by: the world size, or (Join) the number of ranks
  // that contributed. Another divisor than the world size sums and then divides, exactly as the
  // MPI communicator's avg does with its own size.
  void set_gradient_divisor(int divisor) { divisor_ = divisor; }

 private:
  std::shared_ptr<Communicator> comm_;
  Device device_ = Device::cpu();
  void* stream_ = nullptr;
  device::OwnedStream own_stream_;
  bool host_driven_ = false;
  int divisor_ = 0;  // set from the world size at construction
  std::unique_ptr<Communicator> host_staging_;
};

}  // namespace optim
}  // namespace shardopt
