// src/optim/device_context.hpp — where the optimizer's buffers live and how its kernels, copies and collectives are ordered (host, or one CUDA device with a compute stream and a communication stream).
//
// On a device the update, copies and fills run on the compute stream (stream(), which
// ZeroOptimizer::cuda_stream() hands to the caller); a stream-ordered communicator (NCCL) runs
// its collectives on its own stream. Two events, created once, order them: before a
// collective the communication stream waits for the compute stream's work so far
// (settle_before_collective), and after collectives the compute stream waits for them
// (finish_collectives). Neither blocks the host, so the update of one chunk overlaps the
// broadcasts of the previous one. Every device operation goes through a DeviceOps, which a
// CPU test replaces by a counting host implementation.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/device_memory.hpp"
#include "core/flat_buffer.hpp"
#include "optim/device_ops.hpp"
#include "shardopt/communicator.hpp"

namespace shardopt {
namespace optim {

class DeviceContext {
 public:
  // A communicator that runs on a CUDA stream (NCCL) fixes the device now.
  explicit DeviceContext(std::shared_ptr<Communicator> comm);
  // The device path over `ops` on `comm`'s device (for tests: host memory behind a counting
  // DeviceOps; stream-ordered when `comm` reports a stream).
  DeviceContext(std::shared_ptr<Communicator> comm, std::unique_ptr<DeviceOps> ops);
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
  // The compute stream (null on the CPU).
  void* stream() const { return stream_; }
  // The stream the communicator's collectives run on (null unless stream-ordered).
  void* comm_stream() const { return comm_stream_; }
  bool on_device() const { return ops_ != nullptr; }
  // The device operations (on_device() only).
  DeviceOps& ops() const { return *ops_; }

  core::FlatBuffer new_buffer(int64_t numel, DType element_type = DType::f32) const;
  // memcpy/memset on the host; on a device, enqueued on the compute stream.
  void copy_bytes(void* dst, const void* src, std::size_t bytes) const;
  void zero_bytes(void* dst, std::size_t bytes) const;
  // Waits for the compute stream when the caller needs its results on the host (first, within
  // the communicator's timeout, for the collectives the compute stream was made to wait for).
  void synchronize(const char* what) const;

  // Before a collective on device buffers: a stream-ordered communicator's stream waits (on
  // the device) for the compute stream's work so far; a CUDA-aware host communicator reads
  // them on the host's timeline, so the host waits for the compute stream.
  void settle_before_collective() const;
  // Collectives issued since the last settle_before_collective: on a stream-ordered
  // communicator the compute stream waits for them on the device and the host goes on (a
  // failure or a missing peer surfaces at the next host wait on the communicator, within its
  // timeout); otherwise the host waits for each.
  void finish_collectives(std::vector<std::unique_ptr<PendingCollective>>& pending) const;
  // At most `limit` of `pending` left: the oldest are waited for by the host, or, on a
  // stream-ordered communicator, only let go (the device keeps their order).
  void bound_in_flight(std::vector<std::unique_ptr<PendingCollective>>& pending, std::size_t limit) const;
  bool stream_ordered() const { return comm_stream_ != nullptr; }
  // For work that needs finer order than the two events above (the overlap engine's per-bucket
  // events), stream-ordered communicators only: an event, created by the device operations.
  void* create_event() const;
  void destroy_event(void* event) const noexcept;
  // Collectives issued since the last settle_before_collective: on a stream-ordered
  // communicator `event` is recorded behind them on the communication stream (compute_waits
  // orders later compute work after them) and the last one is kept for the next host wait as
  // finish_collectives keeps it, but the compute stream does not wait now; otherwise the host
  // waits for each.
  void record_collectives(std::vector<std::unique_ptr<PendingCollective>>& pending, void* event) const;
  // Stream-ordered: the compute stream waits on the device for `event`'s last record (nothing
  // when `event` is null or the collectives run on the host's timeline).
  void compute_waits(void* event) const;
  // Stream-ordered: the compute stream waits on the device for every collective issued so far.
  void compute_waits_for_collectives() const;
  // Averaging gradients: avg, or (host-driven device collectives) sum and then
  // finish_gradient_average's division on the stream.
  ReduceOp gradient_average_op() const {
    return host_driven_ || divisor_ != world() ? ReduceOp::sum : ReduceOp::avg;
  }
  void finish_gradient_average(void* data, int64_t count, DType dtype) const;
  // Whether finish_gradient_average divides (it then reads the collective's result).
  bool gradient_average_divides() const { return host_driven_ || divisor_ != world(); }
  // The number the gradient sums are divided by: the world size, or (Join) the number of ranks
  // that contributed. Another divisor than the world size sums and then divides, exactly as the
  // MPI communicator's avg does with its own size.
  void set_gradient_divisor(int divisor) { divisor_ = divisor; }
  int gradient_divisor() const { return divisor_; }

 private:
  // Creates the compute stream and, for a stream-ordered communicator, the two events.
  void start_device_path(void* comm_stream);

  std::shared_ptr<Communicator> comm_;
  Device device_ = Device::cpu();
  std::unique_ptr<DeviceOps> ops_;
  void* stream_ = nullptr;       // compute stream, made by ops_
  void* comm_stream_ = nullptr;  // the communicator's (not ours to destroy)
  void* compute_ready_ = nullptr;  // recorded on the compute stream, waited on by the comm stream
  void* comm_done_ = nullptr;      // recorded on the comm stream, waited on by the compute stream
  // The last collective finish_collectives let go, until a host wait waits for it.
  mutable std::unique_ptr<PendingCollective> outstanding_;
  bool host_driven_ = false;
  int divisor_ = 0;  // set from the world size at construction
  std::unique_ptr<Communicator> host_staging_;
};

}  // namespace optim
}  // namespace shardopt
