// src/optim/device_context.cpp — device adoption, the compute and communication streams and their events, buffer allocation, and the copies and collective ordering of the step pipeline.
#include "optim/device_context.hpp"

#include <cstring>

#include "core/check.hpp"
#include "cpu/update_cpu.hpp"
#include "comm/host_staging.hpp"

namespace shardopt {
namespace optim {

DeviceContext::DeviceContext(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
  divisor_ = comm_->size();
  if (!comm_->device().is_cuda()) return;
  void* comm_stream = comm_->cuda_stream();
  SHARDOPT_CHECK(comm_stream != nullptr, unsupported,
                 "ZeroOptimizer: the '{}' communicator works on {} but runs no CUDA stream, so the optimizer "
                 "cannot order its kernels against its collectives",
                 comm_->backend_name(), device_name(comm_->device()));
  device_ = comm_->device();
  ops_ = make_cuda_device_ops(device_);
  start_device_path(comm_stream);
  // The agreement records are staged on the communication stream: they need none of the
  // compute stream's work, and must not wait for it.
  host_staging_ =
      std::make_unique<Communicator>(std::make_shared<comm::HostStagedBackend>(*comm_, device_, comm_stream_));
}

DeviceContext::DeviceContext(std::shared_ptr<Communicator> comm, std::unique_ptr<DeviceOps> ops)
    : comm_(std::move(comm)) {
  divisor_ = comm_->size();
  device_ = comm_->device();
  ops_ = std::move(ops);
  start_device_path(comm_->cuda_stream());
  host_driven_ = comm_stream_ == nullptr && world() > 1;
}

void DeviceContext::start_device_path(void* comm_stream) {
  // Our own non-blocking compute stream, so that collectives on the communicator's stream can
  // run while the next kernels do.
  stream_ = ops_->create_stream();
  comm_stream_ = comm_stream;
  if (comm_stream_ != nullptr) {
    compute_ready_ = ops_->create_event();
    comm_done_ = ops_->create_event();
  }
}

DeviceContext::~DeviceContext() {
  if (ops_ == nullptr) return;
  host_staging_.reset();
  outstanding_.reset();
  ops_->destroy_event(compute_ready_);
  ops_->destroy_event(comm_done_);
  ops_->destroy_stream(stream_);
}

void DeviceContext::adopt(Device device) {
  if (!device.is_cuda() || on_device()) return;
  SHARDOPT_CHECK(world() == 1 || comm_->cuda_aware(), unsupported,
                 "parameters on {} over the host-memory '{}' communicator of {} ranks need a CUDA-aware "
                 "communicator (a CUDA-aware MPI), but this one takes host memory only (rank {}); use "
                 "nccl_world() or nccl_borrow() for CUDA parameters",
                 device_name(device), comm_->backend_name(), world(), rank());
  device_ = device;
  ops_ = make_cuda_device_ops(device_);
  start_device_path(nullptr);
  host_driven_ = world() > 1;
}

Communicator& DeviceContext::host_comm() const { return host_staging_ ? *host_staging_ : *comm_; }

core::FlatBuffer DeviceContext::new_buffer(int64_t numel, DType element_type) const {
  if (on_device()) return ops_->new_buffer(numel, element_type, stream_);
  core::FlatBuffer buffer(device_, nullptr, element_type);
  buffer.resize(numel);
  return buffer;
}

void DeviceContext::copy_bytes(void* dst, const void* src, std::size_t bytes) const {
  if (bytes == 0) return;  // empty shards have null buffers
  if (on_device()) {
    ops_->copy(dst, src, bytes, stream_);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void DeviceContext::zero_bytes(void* dst, std::size_t bytes) const {
  if (bytes == 0) return;
  if (on_device()) {
    ops_->zero(dst, bytes, stream_);
  } else {
    std::memset(dst, 0, bytes);
  }
}

void DeviceContext::synchronize(const char* what) const {
  if (!on_device()) return;
  if (outstanding_) {
    // The compute stream waits for these collectives anyway: waiting for them first costs
    // nothing, and bounds the wait by the communicator's timeout.
    const std::unique_ptr<PendingCollective> last = std::move(outstanding_);
    last->wait();
  }
  ops_->synchronize(stream_, what);
}

void DeviceContext::settle_before_collective() const {
  if (!on_device()) return;
  if (stream_ordered()) {
    ops_->record_event(compute_ready_, stream_);
    ops_->stream_wait_event(comm_stream_, compute_ready_);
  } else if (host_driven_) {
    ops_->synchronize(stream_, "before a host-driven collective on device buffers");
  }
}

void DeviceContext::finish_collectives(std::vector<std::unique_ptr<PendingCollective>>& pending) const {
  if (on_device() && stream_ordered()) {
    // Enqueued behind the collectives on their stream: the compute stream's next work waits
    // for them there. The pending handles only watch completion from the host; dropping them
    // waits for nothing.
    ops_->record_event(comm_done_, comm_stream_);
    ops_->stream_wait_event(stream_, comm_done_);
    // The last one finishes after all the others (one stream, in order): kept so that the next
    // host wait first waits for it within the communicator's timeout (a missing peer then is
    // Error(timeout), not a stream synchronisation that never returns).
    if (!pending.empty()) outstanding_ = std::move(pending.back());
    pending.clear();
    return;
  }
  for (auto& p : pending) p->wait();
  pending.clear();
}

void* DeviceContext::create_event() const {
  SHARDOPT_CHECK(on_device() && stream_ordered(), internal, "an event without a stream-ordered device path");
  return ops_->create_event();
}

void DeviceContext::destroy_event(void* event) const noexcept {
  if (event != nullptr && ops_ != nullptr) ops_->destroy_event(event);
}

void DeviceContext::record_collectives(std::vector<std::unique_ptr<PendingCollective>>& pending, void* event) const {
  if (on_device() && stream_ordered()) {
    ops_->record_event(event, comm_stream_);
    if (!pending.empty()) outstanding_ = std::move(pending.back());
    pending.clear();
    return;
  }
  for (auto& p : pending) p->wait();
  pending.clear();
}

void DeviceContext::compute_waits(void* event) const {
  if (event == nullptr || !on_device() || !stream_ordered()) return;
  ops_->stream_wait_event(stream_, event);
}

void DeviceContext::compute_waits_for_collectives() const {
  std::vector<std::unique_ptr<PendingCollective>> none;
  finish_collectives(none);
}

void DeviceContext::bound_in_flight(std::vector<std::unique_ptr<PendingCollective>>& pending,
                                    std::size_t limit) const {
  if (pending.size() <= limit) return;
  const std::size_t done = pending.size() - limit;
  if (!(on_device() && stream_ordered())) {
    for (std::size_t i = 0; i < done; ++i) pending[i]->wait();
  }
  pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(done));
}

void DeviceContext::finish_gradient_average(void* data, int64_t count, DType dtype) const {
  if (count <= 0 || !gradient_average_divides()) return;
  if (on_device()) {
    ops_->divide(data, dtype, count, static_cast<float>(divisor_), stream_);
  } else {
    kernels::divide_cpu(data, dtype, count, static_cast<float>(divisor_), 1);
  }
}

}  // namespace optim
}  // namespace shardopt
